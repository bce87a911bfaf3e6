package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/credpool/credpool/bench/workload"
)

// procGrace is how long worker processes may take beyond a cell's duration
// (start-up, connecting, the last releases) before they are killed.
const procGrace = 30 * time.Second

// job is what the parent sends a worker process, as one JSON value on its
// stdin. The worker answers with a ready reply, waits for a start message,
// runs, and sends its result.
type job struct {
	Strategy string
	Location location
	// Spec is this process's share of the cell.
	Spec workload.Spec
	// Holders is the memory-mapped holder count every process shares.
	Holders string
	Seed    uint64
}

// startMsg tells a ready worker to begin, so that all processes start
// together and the parent can read command counts just before.
type startMsg struct{ Start bool }

// reply is a worker's message on stdout: ready, then a result (with the
// Redis round trips it took) or an error.
type reply struct {
	Ready      bool             `json:",omitempty"`
	Result     *workload.Result `json:",omitempty"`
	RoundTrips int64            `json:",omitempty"`
	Error      string           `json:",omitempty"`
}

// Worker is a worker process's main: it reads a job from in, runs its share
// of the cell against one of strategies, and writes its result to out.
// credpool runs it for "credpool bench -worker".
func Worker(ctx context.Context, in io.Reader, out io.Writer, strategies []Strategy) error {
	dec, enc := json.NewDecoder(in), json.NewEncoder(out)
	var j job
	if err := dec.Decode(&j); err != nil {
		return fmt.Errorf("bench worker: read job: %w", err)
	}
	err := work(ctx, j, dec, enc, strategies)
	if err != nil {
		// The parent reads this; the error return sets the exit status.
		_ = enc.Encode(reply{Error: err.Error()})
	}
	return err
}

func work(ctx context.Context, j job, dec *json.Decoder, enc *json.Encoder, strategies []Strategy) error {
	i := slices.IndexFunc(strategies, func(s Strategy) bool { return s.Name == j.Strategy })
	if i < 0 {
		return fmt.Errorf("bench worker: unknown strategy %q", j.Strategy)
	}
	c, err := j.Location.open(ctx, strategies[i])
	if err != nil {
		return err
	}
	defer c.close()
	warm(ctx, c.target, j.Spec.Workers)
	holders, err := workload.OpenHolders(j.Holders, j.Spec.Keys, j.Spec.Limit)
	if err != nil {
		return err
	}
	defer holders.Close()
	if err := enc.Encode(reply{Ready: true}); err != nil {
		return fmt.Errorf("bench worker: %w", err)
	}
	var start startMsg
	if err := dec.Decode(&start); err != nil || !start.Start {
		return errors.Join(errors.New("bench worker: no start from the parent"), err)
	}
	trips := c.roundTrips.Total()
	res, err := workload.Run(ctx, c.store, j.Spec, holders, j.Seed)
	if err != nil {
		return err
	}
	return enc.Encode(reply{Result: res, RoundTrips: c.roundTrips.Total() - trips})
}

// proc is one running worker process, seen from the parent.
type proc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	enc    *json.Encoder
	dec    *json.Decoder
	stderr syncBuffer
}

// syncBuffer is a bytes.Buffer that exec's copying goroutine may write
// while the parent reads it to describe a failure.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startProc starts a worker with argv and extra environment and sends it j.
func startProc(ctx context.Context, argv, env []string, j job) (*proc, error) {
	p := &proc{cmd: exec.CommandContext(ctx, argv[0], argv[1:]...)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = &p.stderr
	// After ctx ends the process is killed; this bounds waiting for its pipes.
	p.cmd.WaitDelay = 5 * time.Second
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("bench: worker: %w", err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: worker: %w", err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start worker %s: %w", argv[0], err)
	}
	p.enc, p.dec = json.NewEncoder(p.in), json.NewDecoder(out)
	if err := p.enc.Encode(j); err != nil {
		return p, p.failed(err)
	}
	return p, nil
}

// receive reads the worker's next reply; an Error reply is an error.
func (p *proc) receive() (reply, error) {
	var r reply
	if err := p.dec.Decode(&r); err != nil {
		return r, p.failed(err)
	}
	if r.Error != "" {
		return r, p.failed(errors.New(r.Error))
	}
	return r, nil
}

// failed describes a worker failure with the end of its stderr.
func (p *proc) failed(err error) error {
	msg := strings.TrimSpace(p.stderr.String())
	if len(msg) > 500 {
		msg = "…" + msg[len(msg)-500:]
	}
	if msg == "" {
		return fmt.Errorf("bench: worker process: %w", err)
	}
	return fmt.Errorf("bench: worker process: %w (stderr: %s)", err, msg)
}

// runProcs runs cell in cell.Procs worker processes sharing the holder count
// in holders, and merges their results and Redis round trips. ready runs
// once every worker is connected, just before they start.
func runProcs(ctx context.Context, cfg *Config, cell Cell, s Strategy, loc location, holders string, seed uint64, ready func() error) (*workload.Result, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, cell.Spec.Duration+procGrace)
	// Cancelling kills any worker still running; Wait below reaps them.
	defer cancel()
	var procs []*proc
	defer func() {
		cancel()
		for _, p := range procs {
			_ = p.in.Close()
			_ = p.cmd.Wait()
		}
	}()
	for i := range cell.Procs {
		p, err := startProc(ctx, cfg.Worker, cfg.WorkerEnv, job{
			Strategy: s.Name, Location: loc, Spec: share(cell.Spec, cell.Procs, i),
			Holders: holders, Seed: seed + uint64(i)<<32,
		})
		if p != nil {
			procs = append(procs, p)
		}
		if err != nil {
			return nil, 0, err
		}
	}
	for _, p := range procs {
		r, err := p.receive()
		if err != nil {
			return nil, 0, err
		}
		if !r.Ready {
			return nil, 0, p.failed(errors.New("expected a ready reply"))
		}
	}
	if err := ready(); err != nil {
		return nil, 0, err
	}
	for _, p := range procs {
		if err := p.enc.Encode(startMsg{Start: true}); err != nil {
			return nil, 0, p.failed(err)
		}
	}
	replies := make([]reply, len(procs))
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() {
			replies[i], errs[i] = p.receive()
			if errs[i] == nil && replies[i].Result == nil {
				errs[i] = p.failed(errors.New("no result"))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	merged, trips := &workload.Result{}, int64(0)
	for _, r := range replies {
		merged.Merge(r.Result)
		trips += r.RoundTrips
	}
	return merged, trips, nil
}
