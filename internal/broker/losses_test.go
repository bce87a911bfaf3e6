package broker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/optimistic"
)

// A key the store lost (here deleted behind the broker's back, as a flush
// or a restart without persistence does) while a lease on it was in use is
// not handed out again at once: the lease may still be in use for up to
// MaxLease. It is held back until then, said so, and then granted again
// with a fencing token above every earlier one.
func TestLostKeyIsHeldBack(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	losses := broker.NewLosses()
	const maxLease = 1500 * time.Millisecond
	opts := &broker.Options{Requests: e.requests, Logger: e.log, MaxLease: maxLease, Losses: losses}
	b := broker.New(e.cat, e.store, opts)
	r := req("default")
	r.TTL = maxLease
	held := allocate(t, b, r)
	require.NoError(t, e.store.DeleteKey(t.Context(), "a"))

	before := time.Now()
	_, err := b.Allocate(t.Context(), r)
	full := capacityError(t, err)
	require.WithinDuration(t, before.Add(maxLease), full.FreeAt, time.Second, "held back for MaxLease")
	require.Equal(t, optimistic.StatusCooldown, e.get(t, "a").Status)
	require.Equal(t, optimistic.StatusCooldown, e.info(t, "a").Status, "the store refuses it too")
	require.Equal(t, 1, losses.Report(time.Now()).Held)
	_, err = b.Allocate(t.Context(), r)
	capacityError(t, err)
	require.Equal(t, int64(1), losses.Report(time.Now()).Total, "found once")

	time.Sleep(time.Until(full.FreeAt) + 50*time.Millisecond)
	again := allocate(t, b, r)
	require.Greater(t, again.Fence, held.Fence, "fencing tokens never go back")
	require.Zero(t, losses.Report(time.Now()).Held)
}

// A key that never reached the store is no loss: the first sync grants at
// once. The admin's Sync tells the two apart as well.
func TestNewKeyIsNoLoss(t *testing.T) {
	e := newEnv(t)
	_, err := e.cat.Put(t.Context(), key("a", "default", 1))
	require.NoError(t, err)
	b := e.plain()
	allocate(t, b, req("default"))
	require.False(t, e.get(t, "a").SyncedAt.IsZero(), "the repair recorded the first sync")

	_, err = e.cat.Put(t.Context(), key("b", "default", 1))
	require.NoError(t, err)
	losses := broker.NewLosses()
	admin := broker.NewAdmin(e.cat, e.store, &broker.Options{Losses: losses, Logger: e.log})
	require.NoError(t, e.store.DeleteKey(t.Context(), "a"))
	n, err := admin.Sync(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, optimistic.StatusCooldown, e.info(t, "a").Status, "a was lost: held back")
	require.Equal(t, optimistic.StatusAvailable, e.info(t, "b").Status, "b was new")
	require.Equal(t, broker.LossReport{Held: 1, Until: admin.Losses().Until, Total: 1}, admin.Losses())
}

// The longest lease is a setting: a longer one is refused, for allocate
// and renew.
func TestMaxLease(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	b := broker.New(e.cat, e.store, &broker.Options{MaxLease: time.Minute, Logger: e.log})
	r := req("default")
	r.TTL = time.Minute + time.Second
	_, err := b.Allocate(t.Context(), r)
	require.ErrorIs(t, err, optimistic.ErrInvalid)
	g := allocate(t, b, req("default"))
	_, err = b.Renew(t.Context(), g.LeaseRef, 2*time.Minute)
	require.ErrorIs(t, err, optimistic.ErrInvalid)
}
