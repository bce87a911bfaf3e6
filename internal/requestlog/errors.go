package requestlog

import "errors"

// The request log's own outcomes.
var (
	// ErrInFlight means another caller holds the id and has not recorded
	// its lease yet: retry shortly to get it.
	ErrInFlight = errors.New("requestlog: a request with this id is still in flight")
	// ErrReused means the id is held for a request with other parameters
	// (a fingerprint the caller chose: the broker's is pool and model): the
	// caller reused an id it should not.
	ErrReused = errors.New("requestlog: request id reused with other parameters")
	// ErrClaimLost means the caller's claim expired and the id went to
	// someone else before Record or Forget: nothing was changed.
	ErrClaimLost = errors.New("requestlog: claim no longer held")
)
