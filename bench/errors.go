package bench

import "errors"

// ErrOversold means the oversell audit failed in at least one run: a key
// had more holders than its limit, by the harness's own count or in the
// store's state afterwards. The reports are written all the same.
var ErrOversold = errors.New("bench: oversell audit failed")
