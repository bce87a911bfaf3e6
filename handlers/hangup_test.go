package handlers_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/handlers"
	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/optimistic"
)

// grantsAsCallerLeaves grants once the request's ctx has ended: a grant
// committed just as the caller hung up.
type grantsAsCallerLeaves struct {
	failing
	inAllocate chan struct{}
	released   chan optimistic.LeaseRef
}

func (s *grantsAsCallerLeaves) Allocate(ctx context.Context, _ broker.Request) (broker.Grant, error) {
	close(s.inAllocate)
	<-ctx.Done()
	return broker.Grant{Lease: optimistic.Lease{LeaseRef: optimistic.LeaseRef{
		Provider: "openai", Pool: "default", KeyID: "k", LeaseID: "l",
	}}}, nil
}

func (s *grantsAsCallerLeaves) Release(_ context.Context, ref optimistic.LeaseRef) error {
	s.released <- ref
	return nil
}

// A grant made as the caller hung up goes back at once: nobody would use
// it or release it, and its slot would stay taken until the lease's end.
func TestGrantToACallerWhoLeftGoesBack(t *testing.T) {
	svc := &grantsAsCallerLeaves{inAllocate: make(chan struct{}), released: make(chan optimistic.LeaseRef, 1)}
	h, err := handlers.New(handlers.Config{
		Service: svc, Admin: &svc.failing, Metrics: handlers.NewMetrics(),
		InternalKey: "internal-key-0123456789", AdminKey: "admin-key-0123456789",
		Store: "redis", Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	ctx, hangUp := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/internal/allocate-key",
		strings.NewReader(`{"provider":"openai","model":"m"}`))
	require.NoError(t, err)
	req.Header.Set("X-Internal-Key", "internal-key-0123456789")
	done := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		done <- err
	}()
	<-svc.inAllocate
	hangUp()
	require.Error(t, <-done)
	select {
	case ref := <-svc.released:
		require.Equal(t, "l", ref.LeaseID)
	case <-time.After(10 * time.Second):
		t.Fatal("the grant was not given back")
	}
}
