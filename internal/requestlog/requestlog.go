// Package requestlog remembers which lease answered an allocate request id,
// so that a retried request gets its lease back instead of a second slot.
// It keeps the record where the leases live (Redis, or the SQLite file), so
// it holds across service instances.
//
// A request id moves through three states. Claim reserves a free id for one
// caller, who holds it by a token of its own; the claim must outlive the
// allocation it guards. Record then stores the lease that answered it, for
// as long as the lease lives (Extend follows renewals). Forget frees it,
// for its holder only: after a failed allocation, or once the recorded
// lease is gone. A claim re-sent by the same caller (a lost reply) finds its
// own token and stands; the same id with other parameters is refused.
package requestlog

import (
	"time"

	"github.com/credpool/credpool/optimistic"
)

// Entry is what Claim found under an id that the caller does not hold.
type Entry struct {
	// Token is the holder's token: give it to Forget to free the id.
	Token string
	// Lease answered the id.
	Lease optimistic.Lease
}

// record is the stored form of an id: its holder, the parameters it was
// claimed with, and the lease once recorded.
type record struct {
	Token       string            `json:"t"`
	Fingerprint string            `json:"f"`
	Lease       *optimistic.Lease `json:"l,omitempty"`
}

// judge decides a Claim that found rec under the id: the caller holds it
// (a re-sent claim), or gets the recorded lease, or an error.
func judge(rec record, token, fingerprint string) (Entry, bool, error) {
	switch {
	case rec.Token == token && rec.Lease == nil:
		return Entry{}, true, nil
	case rec.Fingerprint != fingerprint:
		return Entry{}, false, ErrReused
	case rec.Lease == nil:
		return Entry{}, false, ErrInFlight
	}
	return Entry{Token: rec.Token, Lease: *rec.Lease}, false, nil
}

// claimFloor is the shortest claim: a claim must outlive the allocation.
const claimFloor = time.Second
