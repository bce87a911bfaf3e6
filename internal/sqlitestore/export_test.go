package sqlitestore

import "time"

// SetProven sets how long a commit spares Nodes its own write.
func SetProven(s *Store, d time.Duration) { s.proven = d }
