package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/credpool/credpool/bench/report"
	"github.com/credpool/credpool/bench/workload"
	"github.com/credpool/credpool/optimistic"
)

// serviceModel is the one model every key serves and every call asks for.
const serviceModel = "bench-model"

// putKey is the admin API's body for one key.
type putKey struct {
	Provider          string   `json:"provider"`
	Pool              string   `json:"pool"`
	Models            []string `json:"models"`
	Secret            string   `json:"secret"`
	MaxConcurrentUses int      `json:"max_concurrent_uses"`
}

// allocateBody and reportBody are the internal API's request bodies;
// grantAnswer and reportAnswer the parts of its answers the callers read.
type (
	allocateBody struct {
		Provider     string `json:"provider"`
		Model        string `json:"model"`
		Pool         string `json:"pool"`
		LeaseSeconds int    `json:"lease_seconds"`
	}
	reportBody struct {
		Provider string `json:"provider"`
		Pool     string `json:"pool"`
		KeyID    string `json:"key_id"`
		LeaseID  string `json:"lease_id"`
		Outcome  string `json:"outcome"`
	}
	grantAnswer struct {
		KeyID   string `json:"key_id"`
		LeaseID string `json:"lease_id"`
	}
	reportAnswer struct {
		Released bool `json:"released"`
	}
)

// loadKeys puts the keys ids into the service's catalog through the admin
// API, each with the given limit; a key already there is updated.
func (s *service) loadKeys(ctx context.Context, ids []string, limit int) error {
	for _, id := range ids {
		if err := s.adminCall(ctx, http.MethodPut, "keys/"+id, putKey{
			Provider: workload.Provider, Pool: workload.Pool, Models: []string{serviceModel},
			Secret: "sk-bench-" + id, MaxConcurrentUses: limit,
		}); err != nil {
			return err
		}
	}
	return nil
}

// deleteKeys removes the keys from the catalog and the lease store, so a
// Redis the harness did not start keeps nothing of the run.
func (s *service) deleteKeys(ctx context.Context, ids []string) error {
	for _, id := range ids {
		if err := s.adminCall(ctx, http.MethodDelete, "keys/"+id, nil); err != nil {
			return err
		}
	}
	return nil
}

// liveLeases reads the keys' live leases and limits as the admin API
// lists them (GET /api/admin/keys); a key it does not list, or not as in
// the lease store, is missing.
func (s *service) liveLeases(ctx context.Context, ids ...string) ([]optimistic.KeyInfo, error) {
	code, body, err := s.do(ctx, http.MethodGet, "/api/admin/keys", "X-Admin-Key", s.admin, nil)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%d %s", code, bytes.TrimSpace(body))
	}
	var list struct {
		Keys []struct {
			ID                string `json:"id"`
			MaxConcurrentUses int    `json:"max_concurrent_uses"`
			LiveLeases        int    `json:"live_leases"`
			InStore           bool   `json:"in_store"`
		} `json:"keys"`
	}
	if err == nil {
		err = json.Unmarshal(body, &list)
	}
	if err != nil {
		return nil, fmt.Errorf("bench: GET /api/admin/keys: %w", err)
	}
	listed := make(map[string]optimistic.KeyInfo, len(list.Keys))
	for _, k := range list.Keys {
		listed[k.ID] = optimistic.KeyInfo{ID: k.ID, Exists: k.InStore, Limit: k.MaxConcurrentUses, Live: k.LiveLeases}
	}
	out := make([]optimistic.KeyInfo, len(ids))
	for i, id := range ids {
		out[i] = listed[id]
		out[i].ID = id
	}
	return out, nil
}

// clearLeases force-releases every lease of the keys.
func (s *service) clearLeases(ctx context.Context, ids []string) error {
	for _, id := range ids {
		if err := s.adminCall(ctx, http.MethodPost, "keys/"+id+"/clear-leases", nil); err != nil {
			return err
		}
	}
	return nil
}

// check runs one allocate and report, which must both succeed, before
// anything is measured.
func (s *service) check(ctx context.Context, leaseSeconds int) error {
	code, body, err := s.call(ctx, "allocate-key", allocateRequest(leaseSeconds))
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%d %s", code, body)
	}
	var g grantAnswer
	if err == nil {
		err = json.Unmarshal(body, &g)
	}
	if err == nil {
		code, body, err = s.call(ctx, "report", reportRequest(g))
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("report: %d %s", code, body)
		}
	}
	if err != nil {
		return s.failed(fmt.Errorf("first allocation: %w", err))
	}
	return nil
}

func allocateRequest(leaseSeconds int) []byte {
	return mustJSON(allocateBody{
		Provider: workload.Provider, Model: serviceModel, Pool: workload.Pool, LeaseSeconds: leaseSeconds,
	})
}

func reportRequest(g grantAnswer) []byte {
	return mustJSON(reportBody{
		Provider: workload.Provider, Pool: workload.Pool, KeyID: g.KeyID, LeaseID: g.LeaseID, Outcome: "success",
	})
}

// mustJSON encodes v, whose types cannot fail to encode.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// drive runs spec.Workers callers against the service instances svcs,
// caller w calling svcs[w % len(svcs)], for spec.Duration (or until ctx
// ends) in a closed loop: allocate, and when granted report success at
// once, which releases; after any other answer pause as after "no slot".
// ids are the loaded keys, in the holder count's order. A cycle started
// before the end is finished, so no slot is left held.
func drive(ctx context.Context, svcs []*service, spec workload.Spec, ids []string, seed uint64) report.ServiceRun {
	d := &driver{
		spec: spec, index: map[string]int{}, holders: workload.NewHolders(len(ids), spec.Limit),
		allocate: allocateRequest(int(spec.TTL / time.Second)),
	}
	for i, id := range ids {
		d.index[id] = i
	}
	callers := make([]*caller, spec.Workers)
	for w := range callers {
		c := &caller{
			conn:     newHTTPConn(svcs[w%len(svcs)]),
			run:      report.ServiceRun{AllocateStatus: map[string]int64{}, ReportStatus: map[string]int64{}},
			rng:      rand.New(rand.NewPCG(seed, uint64(w))),
			allocLat: workload.NewHistogram(), reportLat: workload.NewHistogram(),
		}
		defer c.conn.close()
		// Connections are opened before the clock starts; one that fails
		// here is dialled again by the first call, and counted.
		_ = c.conn.dial(ctx)
		callers[w] = c
	}
	conflicts, cerr := totalConflicts(ctx, svcs)
	dials := totalDials(svcs)
	// Callers give their grants up at once: the store's state is read
	// during the run (see sampler), through the admin API.
	during := sample(ctx, svcs[0].liveLeases, ids, spec.Limit, len(ids))
	defer during.stop()
	start := time.Now()
	deadline := start.Add(spec.Duration)
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Go(func() { d.loop(ctx, c, deadline) })
	}
	wg.Wait()
	elapsed := time.Since(start)

	perInstance := make([]int64, len(svcs))
	for w, c := range callers {
		perInstance[w%len(svcs)] += c.run.Cycles
	}
	out := callers[0]
	for _, c := range callers[1:] {
		out.merge(c)
	}
	run := out.run
	run.Audit.Add(during.stop())
	run.InstanceCycles = perInstance
	run.ElapsedSeconds = elapsed.Seconds()
	run.CyclesPerSec = float64(run.Cycles) / elapsed.Seconds()
	run.Dials = totalDials(svcs) - dials
	run.AllocateLatency, run.ReportLatency = latency(out.allocLat), latency(out.reportLat)
	after, err := totalConflicts(ctx, svcs)
	if err = cmp.Or(cerr, err); err != nil {
		run.FirstError = cmp.Or(run.FirstError, err.Error())
	} else {
		run.Conflicts = new(after - conflicts)
	}
	return run
}

// totalConflicts is the allocation attempts of svcs that lost a race so
// far, from their metrics.
func totalConflicts(ctx context.Context, svcs []*service) (int64, error) {
	var n int64
	for _, s := range svcs {
		c, err := s.conflicts(ctx)
		if err != nil {
			return 0, err
		}
		n += c
	}
	return n, nil
}

// totalDials is the connections opened to any of svcs so far.
func totalDials(svcs []*service) int64 {
	var n int64
	for _, s := range svcs {
		n += s.dials.Load()
	}
	return n
}

// driver is what the callers of one drive share.
type driver struct {
	spec     workload.Spec
	index    map[string]int // read-only during the run
	holders  *workload.Holders
	allocate []byte
}

// caller is one caller's instance and tally, merged into the first after
// the run.
type caller struct {
	conn                *httpConn
	run                 report.ServiceRun // counts only
	rng                 *rand.Rand
	allocLat, reportLat *workload.Histogram
}

func (d *driver) loop(ctx context.Context, c *caller, deadline time.Time) {
	for time.Now().Before(deadline) && ctx.Err() == nil {
		start := time.Now()
		code, body, err := c.conn.call(ctx, "allocate-key", d.allocate)
		if err != nil && ctx.Err() != nil {
			return // cut short by the harness's caller, not the service's doing
		}
		c.run.AllocateCalls++
		c.run.AllocateStatus[statusKey(code, err)]++
		var g grantAnswer
		if err == nil && code == http.StatusOK {
			err = json.Unmarshal(body, &g)
		}
		if err != nil || code != http.StatusOK {
			c.failed("allocate", code, body, err)
			if !workload.Sleep(ctx, d.pause(c)) {
				return
			}
			continue
		}
		c.allocLat.Record(time.Since(start))
		d.hold(c, g)
		if !d.sendReport(ctx, c, g) && !workload.Sleep(ctx, d.pause(c)) {
			return
		}
	}
}

// hold checks the grant against the holder count, then gives it up before
// the report releases it.
func (d *driver) hold(c *caller, g grantAnswer) {
	i, ok := d.index[g.KeyID]
	if !ok {
		c.violation(fmt.Sprintf("granted %q, which the harness did not load", g.KeyID))
		return
	}
	n, over := d.holders.Acquire(i)
	c.run.Audit.MaxHolders = max(c.run.Audit.MaxHolders, n)
	if over {
		c.violation(fmt.Sprintf("%d holders of %s, limit %d", n, g.KeyID, d.spec.Limit))
	}
	d.holders.Drop(i)
}

// sendReport reports success on the grant, even after ctx ends so that no slot
// is left held, and says whether it was answered 200.
func (d *driver) sendReport(ctx context.Context, c *caller, g grantAnswer) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpTimeout)
	defer cancel()
	start := time.Now()
	code, body, err := c.conn.call(rctx, "report", reportRequest(g))
	c.run.ReportCalls++
	c.run.ReportStatus[statusKey(code, err)]++
	var a reportAnswer
	if err == nil && code == http.StatusOK {
		err = json.Unmarshal(body, &a)
	}
	if err != nil || code != http.StatusOK {
		c.failed("report", code, body, err)
		return false
	}
	c.reportLat.Record(time.Since(start))
	if a.Released {
		c.run.Cycles++
	} else {
		c.run.NotReleased++
	}
	return true
}

// pause draws one pause after an unsuccessful call: Pause ±50%.
func (d *driver) pause(c *caller) time.Duration {
	return time.Duration((0.5 + c.rng.Float64()) * float64(d.spec.Pause))
}

// statusKey names an answer in the status counts.
func statusKey(code int, err error) string {
	if code == 0 && err != nil {
		return "no_response"
	}
	return strconv.Itoa(code)
}

// failed keeps the first unsuccessful answer's description. 429 is the
// service's normal "no slot now" and is only counted.
func (c *caller) failed(op string, code int, body []byte, err error) {
	if c.run.FirstError != "" || (code == http.StatusTooManyRequests && err == nil) {
		return
	}
	if err != nil {
		c.run.FirstError = fmt.Sprintf("%s: %v", op, err)
		return
	}
	c.run.FirstError = fmt.Sprintf("%s: %d %s", op, code, truncate(string(body), 300))
}

func (c *caller) violation(msg string) {
	c.run.Audit.HolderViolations++
	if c.run.Audit.First == "" {
		c.run.Audit.First = msg
	}
}

// merge adds o's tally into c.
func (c *caller) merge(o *caller) {
	r, x := &c.run, &o.run
	r.Cycles += x.Cycles
	r.AllocateCalls += x.AllocateCalls
	r.ReportCalls += x.ReportCalls
	r.NotReleased += x.NotReleased
	for k, n := range x.AllocateStatus {
		r.AllocateStatus[k] += n
	}
	for k, n := range x.ReportStatus {
		r.ReportStatus[k] += n
	}
	r.Audit.HolderViolations += x.Audit.HolderViolations
	r.Audit.MaxHolders = max(r.Audit.MaxHolders, x.Audit.MaxHolders)
	if r.Audit.First == "" {
		r.Audit.First = x.Audit.First
	}
	if r.FirstError == "" {
		r.FirstError = x.FirstError
	}
	c.allocLat.Merge(o.allocLat)
	c.reportLat.Merge(o.reportLat)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
