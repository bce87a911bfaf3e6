package bench

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// httpConn is one caller's own HTTP/1.1 connection to a service: the caller's
// goroutine writes each request and reads its answer, the connection is
// kept alive, and it is dialled again after an error or an answer that
// closes it. That is what net/http's client does for one request at a
// time, without its two goroutines per connection and the hand-offs
// between them: on the CPUs the service shares, the harness's callers
// took about 60 µs of CPU per cycle this way against 97-120 µs with
// net/http's client (measured side by side). It is not safe for
// concurrent use.
type httpConn struct {
	s    *service
	host string // host:port
	nc   net.Conn
	br   *bufio.Reader
	req  []byte // the request being written
}

// newHTTPConn returns a connection to s, dialled at the first call.
func newHTTPConn(s *service) *httpConn {
	return &httpConn{s: s, host: strings.TrimPrefix(s.base, "http://")}
}

// dial opens the connection, counted in the service's dials.
func (c *httpConn) dial(ctx context.Context) error {
	c.s.dials.Add(1)
	nc, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", c.host)
	if err != nil {
		return err
	}
	c.nc, c.br = nc, bufio.NewReader(nc)
	return nil
}

// close closes the connection, if open.
func (c *httpConn) close() {
	if c.nc != nil {
		_ = c.nc.Close()
		c.nc = nil
	}
}

// call is service.call on this connection: it POSTs body to the internal
// API's path and returns the status and the answer's body. It gives up at
// httpTimeout or when ctx ends; after an error the connection is closed.
func (c *httpConn) call(ctx context.Context, path string, body []byte) (int, []byte, error) {
	code, out, err := c.roundTrip(ctx, path, body)
	if err != nil {
		c.close()
	}
	return code, out, err
}

func (c *httpConn) roundTrip(ctx context.Context, path string, body []byte) (int, []byte, error) {
	if c.nc == nil {
		if err := c.dial(ctx); err != nil {
			return 0, nil, err
		}
	}
	deadline := time.Now().Add(httpTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	nc := c.nc
	if err := nc.SetDeadline(deadline); err != nil {
		return 0, nil, err
	}
	// A past deadline wakes the write or read under way. Once set, it
	// would fail the next call too: the connection goes.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() {
			c.close()
		}
	}()
	c.req = append(c.req[:0], "POST /api/internal/"...)
	c.req = append(c.req, path...)
	c.req = append(c.req, " HTTP/1.1\r\nHost: "...)
	c.req = append(c.req, c.host...)
	c.req = append(c.req, "\r\nX-Internal-Key: "...)
	c.req = append(c.req, c.s.internal...)
	c.req = append(c.req, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	c.req = strconv.AppendInt(c.req, int64(len(body)), 10)
	c.req = append(c.req, "\r\n\r\n"...)
	c.req = append(c.req, body...)
	if _, err := nc.Write(c.req); err != nil {
		return 0, nil, ctxErr(ctx, err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, nil, ctxErr(ctx, err)
	}
	out, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return 0, nil, ctxErr(ctx, err)
	}
	if resp.Close {
		c.close()
	}
	return resp.StatusCode, out, nil
}

// ctxErr is ctx's error if it ended, which the past deadline turned into
// err; err otherwise.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
