package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/credpool/credpool/internal/redisproc"
)

// SentinelMaster is the name the sentinels of StartSentinels watch their
// master under.
const SentinelMaster = "credpool"

// Sentinels is a master, its replicas and three sentinels that watch it
// and fail it over, all real processes on loopback.
type Sentinels struct {
	Master    *Server
	Replicas  []*Server
	Sentinels []*redisproc.Sentinel
}

// StartSentinels starts a master, replicas replicas in sync with it and
// three sentinels (quorum two) that know them all, ready to fail over, and
// stops them when t ends.
func StartSentinels(t testing.TB, replicas int) *Sentinels {
	t.Helper()
	s := &Sentinels{Master: Start(t)}
	for range replicas {
		s.Replicas = append(s.Replicas, StartReplica(t, s.Master.Addr))
	}
	all, err := redisproc.RunSentinels(t.TempDir(), SentinelMaster, s.Master.Addr, 3, replicas)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for _, sn := range all {
		t.Cleanup(sn.Stop)
	}
	s.Sentinels = all
	return s
}

// URL is the redis+sentinel:// URL of the master, naming every sentinel.
func (s *Sentinels) URL() string {
	addrs := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		addrs[i] = sn.Addr
	}
	return "redis+sentinel://" + strings.Join(addrs, ",") + "/" + SentinelMaster
}

// WaitFailover waits, up to limit, until every sentinel names a master
// other than old, the same one, and returns its address.
func (s *Sentinels) WaitFailover(t testing.TB, old string, limit time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		if addr, ok := s.agreed(ctx); ok && addr != old {
			return addr
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: the sentinels did not fail %s over within %s", old, limit)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// agreed returns the master every sentinel names, if they agree.
func (s *Sentinels) agreed(ctx context.Context) (string, bool) {
	var first string
	for i, sn := range s.Sentinels {
		addr, err := sn.Master(ctx, SentinelMaster)
		if err != nil || (i > 0 && addr != first) {
			return "", false
		}
		first = addr
	}
	return first, true
}
