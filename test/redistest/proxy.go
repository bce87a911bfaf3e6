package redistest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a loopback TCP proxy in front of a server, for injecting faults
// a client cannot tell from a real network failure.
type Proxy struct {
	// Addr is where clients connect.
	Addr     string
	ln       net.Listener
	cut      atomic.Pointer[[]byte] // a command whose next reply to drop
	cuts     atomic.Int64
	refuse   atomic.Pointer[[]byte] // a lone command to answer with an error
	refusals atomic.Int64
	wg       sync.WaitGroup

	mu     sync.Mutex
	target string
	down   bool
	held   chan struct{}     // while blackholed: closed when it ends; else nil
	conns  map[net.Conn]bool // open client connections
}

// NewProxy forwards connections on a free loopback port to target until t
// ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.SetBlackhole(false)
		p.wg.Wait()
	})
	return p
}

// CutNextExec makes the proxy deliver the next EXEC to the server, let the
// server run it, then drop the reply and close that connection: the client
// cannot know whether its transaction committed.
func (p *Proxy) CutNextExec() { p.CutNextReply("exec") }

// CutNextReply is CutNextExec for the next request that carries the
// command name (e.g. "set"): the server runs it, the reply is lost.
func (p *Proxy) CutNextReply(name string) {
	marker := []byte("\r\n" + strings.ToLower(name) + "\r\n")
	p.cut.Store(&marker)
}

// Cuts says how many replies the proxy has dropped.
func (p *Proxy) Cuts() int { return int(p.cuts.Load()) }

// RefuseNext makes the proxy answer the next request that is the lone
// command name (no arguments, e.g. "unwatch") with an error reply of its
// own, without the server ever seeing it: a server that refuses a command.
func (p *Proxy) RefuseNext(name string) {
	req := []byte(fmt.Sprintf("*1\r\n$%d\r\n%s\r\n", len(name), strings.ToLower(name)))
	p.refuse.Store(&req)
}

// Refusals says how many requests the proxy has refused.
func (p *Proxy) Refusals() int { return int(p.refusals.Load()) }

// refused reports whether chunk is the request RefuseNext named, and if so
// forgets it.
func (p *Proxy) refused(chunk []byte) bool {
	req := p.refuse.Load()
	if req == nil || !bytes.Equal(bytes.ToLower(chunk), *req) || !p.refuse.CompareAndSwap(req, nil) {
		return false
	}
	p.refusals.Add(1)
	return true
}

// Conns says how many client connections the proxy holds open: a client
// that dialled it is known to be talking to the server (or, blackholed,
// waiting for it).
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// SetTarget sends new connections to addr and closes the open ones, as a
// failover that moves a service address to another server does.
func (p *Proxy) SetTarget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = addr
	for c := range p.conns {
		_ = c.Close()
	}
}

// SetDown cuts the server off, or brings it back: while down, every open
// connection is closed and new ones are closed at once, as when the
// network between client and server fails. The server keeps its data.
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

// SetBlackhole stops all traffic through the proxy, or lets it flow
// again: while on, connections stay open and new ones are accepted, but
// nothing gets through in either direction, as when a network drops
// packets without a reset. A client sees only silence, until its own
// timeouts. What was sent meanwhile is held and delivered once the
// blackhole ends, as TCP retransmits it.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.held == nil:
		p.held = make(chan struct{})
	case !on && p.held != nil:
		close(p.held)
		p.held = nil
	}
}

// pass waits while the proxy is blackholed.
func (p *Proxy) pass() {
	p.mu.Lock()
	held := p.held
	p.mu.Unlock()
	if held != nil {
		<-held
	}
}

// track registers an accepted client connection and returns the server to
// send it to, or "" while down.
func (p *Proxy) track(c net.Conn) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return ""
	}
	if p.conns == nil {
		p.conns = map[net.Conn]bool{}
	}
	p.conns[c] = true
	return p.target
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		target := p.track(client)
		if target == "" {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			p.untrack(client)
			_ = client.Close()
			continue
		}
		p.wg.Add(2)
		var mute atomic.Bool
		go p.toServer(client, server, &mute)
		go p.toClient(server, client, &mute)
	}
}

func (p *Proxy) toServer(client, server net.Conn, mute *atomic.Bool) {
	defer p.wg.Done()
	defer p.untrack(client)
	defer client.Close()
	defer server.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			p.pass()
			chunk := buf[:n]
			if p.refused(chunk) {
				if _, werr := client.Write([]byte("-ERR refused by the fault proxy\r\n")); werr != nil || err != nil {
					return
				}
				continue
			}
			marker := p.cut.Load()
			cutting := marker != nil && bytes.Contains(bytes.ToLower(chunk), *marker) && p.cut.CompareAndSwap(marker, nil)
			if cutting {
				mute.Store(true)
			}
			if _, werr := server.Write(chunk); werr != nil {
				return
			}
			if cutting {
				// Give the server time to run it before hanging up.
				time.Sleep(200 * time.Millisecond)
				p.cuts.Add(1)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) toClient(server, client net.Conn, mute *atomic.Bool) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			p.pass()
		}
		if n > 0 && !mute.Load() {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				_ = client.Close()
			}
			return
		}
	}
}
