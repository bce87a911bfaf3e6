package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A caller's connection sends what net/http's client would, keeps the
// connection for the next call, and dials again after an answer that
// closes it or a connection the server dropped; a call whose ctx ends
// returns at once with ctx's error.
func TestHTTPConn(t *testing.T) {
	var mode atomic.Value
	mode.Store("ok")
	hang, entered := make(chan struct{}), make(chan struct{}, 1)
	// What the server saw of each request, checked by the test.
	type seen struct {
		method, path, host, key, contentType string
		length                               int64
		body                                 string
	}
	requests := make(chan seen, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			body = []byte(err.Error())
		}
		requests <- seen{
			r.Method, r.URL.Path, r.Host, r.Header.Get("X-Internal-Key"), r.Header.Get("Content-Type"),
			r.ContentLength, string(body),
		}
		switch mode.Load() {
		case "close":
			w.Header().Set("Connection", "close")
		case "drop":
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = c.Close()
			}
			return
		case "hang":
			entered <- struct{}{}
			<-hang
		}
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write(append([]byte("got "), body...))
	}))
	t.Cleanup(srv.Close)
	// Before Close, which waits for the handler.
	t.Cleanup(func() { close(hang) })
	s := &service{base: srv.URL, internal: "secret"}
	c := newHTTPConn(s)
	t.Cleanup(c.close)

	call := func() (int, string, error) {
		code, out, err := c.call(t.Context(), "allocate-key", []byte(`{"a":1}`))
		return code, string(out), err
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	for range 3 {
		code, out, err := call()
		require.NoError(t, err)
		require.Equal(t, http.StatusTeapot, code)
		require.Equal(t, `got {"a":1}`, out)
		require.Equal(t, seen{
			method: http.MethodPost, path: "/api/internal/allocate-key", host: host, key: "secret",
			contentType: "application/json", length: 7, body: `{"a":1}`,
		}, <-requests)
	}
	require.EqualValues(t, 1, s.dials.Load(), "one connection for every call")

	// One call answered as mode says (an error or not, as fails says), then
	// one answered plainly, on a connection dialled again.
	for i, answer := range []struct {
		mode  string
		fails bool
	}{{"close", false}, {"drop", true}} {
		mode.Store(answer.mode)
		_, _, err := call()
		require.Equal(t, answer.fails, err != nil, "%s: %v", answer.mode, err)
		mode.Store("ok")
		_, _, err = call()
		require.NoError(t, err)
		require.EqualValues(t, 2+i, s.dials.Load(), "dialled again after %s", answer.mode)
	}

	mode.Store("hang")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, _, err := c.call(ctx, "allocate-key", []byte(`{}`))
		done <- err
	}()
	<-entered // the call waits for the answer
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(httpTimeout / 4):
		t.Fatal("the cancelled call waited for the answer, not for its ctx")
	}
}
