package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/credpool/credpool/optimistic"
)

// IDStore is where a lease store keeps its own id, written once: a Redis
// key under the store's prefix, a row of the SQLite store's file. An id
// kept in the store names it however it is reached (a hostname or an
// address), tells two stores apart even if both are files, and goes with
// the store's data when the store loses it.
type IDStore interface {
	// EnsureID makes id the store's id unless it has one, and returns the
	// id it has and whether it wrote id. A store that has an id is only
	// read. On failure nothing is written.
	EnsureID(ctx context.Context, id string) (string, bool, error)
}

// rereadEvery bounds how often a StoreID reads its store's id again.
const rereadEvery = time.Second

// StoreID is the lease store's identity as the catalog's records of
// synced keys name it (catalog.Key.SyncedStore): the id the store keeps
// (IDStore), and the other names this process knows it by. It is safe for
// concurrent use; a Broker and its Admin share one.
//
// The instances on one store converge on one id: each reads the store's
// id again when a key is marked with an id it does not know, and when the
// store lacks a key (once a second at most), writing its own back only if
// the store has none. One that finds another instance's id there adopts
// it, and keeps counting its old one as this store's.
type StoreID struct {
	ids IDStore // nil: a fixed name, never read again
	log *slog.Logger
	// reading lets one read of the store's id run at a time; the callers
	// that waited for it take its answer.
	reading chan struct{}
	state   atomic.Pointer[idState]
}

// idState is one immutable view of the store's names.
type idState struct {
	current string
	// unread: the store's id could not be read yet (on a cluster, the
	// master of its slot was down at start); current is the id to write
	// if the store has none.
	unread bool
	// former holds the store's other names: ids it had before (lost with
	// its data, or replaced by another instance's), and the name older
	// releases derived from its address.
	former map[string]bool
	// read is when the store's id was last read, or tried.
	read time.Time
}

// NewStoreID reads the store's id from ids, writing a new random one if
// it has none, and counts each of legacy as this store's name too: the
// name a release before store ids gave it (its URL, or "sqlite"), so that
// an upgrade does not take the keys it synced for another store's. log
// gets a line when the id is read, written or changes.
//
// A store that does not answer (on a Redis Cluster, the master of the
// id's slot) is no error, so that an instance starts while the others
// serve: until a later read (tried once a second as keys sync and grant)
// gets the id, every name counts as this store's, as before store ids,
// and no key is marked synced.
func NewStoreID(ctx context.Context, ids IDStore, log *slog.Logger, legacy ...string) *StoreID {
	if log == nil {
		log = slog.Default()
	}
	// The empty name marks keys synced while no instance had read the
	// id (see mark), and by releases that recorded when, not where.
	former := map[string]bool{"": true}
	for _, l := range legacy {
		former[l] = true
	}
	s := &StoreID{ids: ids, log: log, reading: make(chan struct{}, 1)}
	s.state.Store(&idState{current: uuid.NewString(), unread: true, former: former})
	if err := s.reread(ctx); err != nil {
		log.WarnContext(ctx, "lease store id not read: keys another store synced are not held back until it is", "err", err)
	}
	return s
}

// fixedStoreID is a StoreID with one name and no store behind it:
// Options' default.
func fixedStoreID(id string) *StoreID {
	s := &StoreID{}
	s.state.Store(&idState{current: id})
	return s
}

// ID returns the store's id, and whether it is known (see NewStoreID).
func (s *StoreID) ID() (string, bool) {
	st := s.state.Load()
	return st.current, !st.unread
}

// mark returns the name the catalog records for keys synced now: the
// store's id, or, while it is unread, the empty name, which every
// instance counts as its store's (a loss of the key is still noticed: it
// reached a store), and which the first instance to know the id marks
// again with it.
func (s *StoreID) mark() string {
	if id, known := s.ID(); known {
		return id
	}
	return ""
}

// owns reports whether name names this store, as far as this process
// knows: any name does while the store's id is unread.
func (s *StoreID) owns(name string) bool {
	st := s.state.Load()
	return st.unread || name == st.current || st.former[name]
}

// reread reads the store's id again, unless a read ended (or failed) less
// than rereadEvery ago, or another is under way: the caller then goes by
// the names known, and waits for no read (a store that does not answer
// holds up one request at a time, not each in turn). It writes the
// current id back if the store has none, and adopts the store's if it
// holds another. On failure the names stay as they are; a read that
// ctx cut short counts as none. A name that became the store's id less
// than rereadEvery after the last read is taken for another store's until
// the next read: a key marked with it meanwhile is held back once.
func (s *StoreID) reread(ctx context.Context) error {
	if s.ids == nil || time.Since(s.state.Load().read) < rereadEvery {
		return nil
	}
	select {
	case s.reading <- struct{}{}:
	default:
		return nil
	}
	defer func() { <-s.reading }()
	st := s.state.Load()
	if time.Since(st.read) < rereadEvery {
		return nil
	}
	id, wrote, err := s.ids.EnsureID(ctx, st.current)
	next := *st
	if ctx.Err() == nil {
		next.read = time.Now()
	}
	if err == nil && id == "" {
		err = fmt.Errorf("%w: an empty id", optimistic.ErrStore)
	}
	if err != nil {
		s.state.Store(&next)
		return fmt.Errorf("read the lease store's id: %w", err)
	}
	switch {
	case st.unread && wrote:
		s.log.InfoContext(ctx, "lease store id written: a new store, or one that lost its data", "store_id", id)
	case st.unread:
		s.log.InfoContext(ctx, "lease store id read", "store_id", id)
	case wrote:
		s.log.WarnContext(ctx, "the lease store had lost its id, with its data (a restart without persistence, a flush, an eviction): written again",
			"store_id", id)
	case id != st.current:
		s.log.WarnContext(ctx, "the lease store holds another id, written by another instance after it lost its data: adopted",
			"store_id", id, "former_id", st.current)
		next.former = map[string]bool{st.current: true}
		for name := range st.former {
			next.former[name] = true
		}
	}
	next.current, next.unread = id, false
	s.state.Store(&next)
	return nil
}
