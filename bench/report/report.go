package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Report is one harness invocation: where it ran, then one Run per cell and
// strategy, in the order they ran.
type Report struct {
	Env  Env   `json:"env"`
	Runs []Run `json:"runs"`
	// Skipped are the strategies left out of some cells, and why.
	Skipped []Skip `json:"skipped,omitempty"`
}

// Skip is a strategy left out of some cells: Runs counts the runs (cells
// times repetitions) it did not make.
type Skip struct {
	Strategy string `json:"strategy"`
	Reason   string `json:"reason"`
	Runs     int    `json:"runs"`
}

// Skip records that strategy did not run one cell, for reason.
func (r *Report) Skip(strategy, reason string) {
	for i, s := range r.Skipped {
		if s.Strategy == strategy && s.Reason == reason {
			r.Skipped[i].Runs++
			return
		}
	}
	r.Skipped = append(r.Skipped, Skip{Strategy: strategy, Reason: reason, Runs: 1})
}

// Env is the machine and software a report was measured on.
type Env struct {
	Started     time.Time `json:"started"`
	CommandLine string    `json:"command_line"`
	GoVersion   string    `json:"go_version"`
	GoRedis     string    `json:"go_redis_version"`
	// Redis is the server's version and RedisServer where it ran; both
	// empty when no strategy used Redis.
	Redis       string   `json:"redis_version,omitempty"`
	RedisServer string   `json:"redis_server,omitempty"`
	GOMAXPROCS  int      `json:"gomaxprocs"`
	NumCPU      int      `json:"num_cpu"`
	CPUModel    string   `json:"cpu_model,omitempty"`
	OS          string   `json:"os"`
	Arch        string   `json:"arch"`
	Strategies  []string `json:"strategies"`
}

// CollectEnv describes this process's machine and build; the caller adds
// the Redis fields and the strategies.
func CollectEnv(args []string) Env {
	return Env{
		Started:     time.Now().UTC().Truncate(time.Second),
		CommandLine: CommandLine(args),
		GoVersion:   runtime.Version(),
		GoRedis:     goRedisVersion(),
		GOMAXPROCS:  runtime.GOMAXPROCS(0),
		NumCPU:      runtime.NumCPU(),
		CPUModel:    cpuModel(),
		OS:          runtime.GOOS,
		Arch:        runtime.GOARCH,
	}
}

// goRedisVersion is the go-redis module version linked into this binary.
// Test binaries carry no dependency list; go-redis's own constant stands in.
func goRedisVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path != "github.com/redis/go-redis/v9" {
				continue
			}
			if m.Replace != nil {
				return m.Replace.Version
			}
			return m.Version
		}
	}
	return "v" + redis.Version()
}

// cpuModel reads the first "model name" of /proc/cpuinfo; "" where there
// is none.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if name, value, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return ""
}

// CommandLine joins args as a shell would need them, quoting where needed.
func CommandLine(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}();&|<>#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		quoted[i] = a
	}
	return strings.Join(quoted, " ")
}

// Run is one cell on one strategy, once.
type Run struct {
	Strategy string `json:"strategy"`
	// Rep numbers the cell's repetitions from 1 (see bench.Config.Reps).
	Rep      int    `json:"rep"`
	Scenario string `json:"scenario"`
	// Loop is "closed" or "open"; Rate is the open loop's offered
	// allocations per second.
	Loop       string  `json:"loop"`
	Rate       float64 `json:"rate,omitempty"`
	Keys       int     `json:"keys"`
	Limit      int     `json:"limit"`
	Candidates int     `json:"candidates"`
	Choice     string  `json:"choice"`
	Order      string  `json:"order"`
	Workers    int     `json:"workers"`
	Procs      int     `json:"procs"`
	Hold       string  `json:"hold"`
	HoldDist   string  `json:"hold_dist"`
	Duration   string  `json:"duration"`
	Ops        int64   `json:"ops,omitempty"`
	CrashShare float64 `json:"crash_share,omitempty"`
	TTL        string  `json:"ttl"`
	// Pause is the closed loop's pause after "no slot" (±50%).
	Pause string `json:"pause"`
	// Wait is the bound of each call of waiting callers
	// (AllocateRequest.Wait, never past the end of the run), who never
	// pause; empty for retrying callers.
	Wait string `json:"wait,omitempty"`

	ElapsedSeconds float64 `json:"elapsed_seconds"`
	Counts         Counts  `json:"counts"`

	GrantsPerSec  float64 `json:"grants_per_sec"`
	NoSlotPerSec  float64 `json:"no_slot_per_sec"`
	GiveUpsPerSec float64 `json:"give_ups_per_sec"`
	ErrorsPerSec  float64 `json:"errors_per_sec"`
	// The per-grant figures are nil when nothing was granted; the Redis
	// ones also for stores without Redis. CommandsPerGrant is what the
	// server ran (INFO commandstats, commands inside scripts included),
	// RoundTripsPerGrant what the clients sent (a pipeline is one).
	ConflictsPerGrant  *float64 `json:"conflicts_per_grant"`
	AttemptsPerGrant   *float64 `json:"attempts_per_grant"`
	CommandsPerGrant   *float64 `json:"commands_per_grant"`
	RoundTripsPerGrant *float64 `json:"round_trips_per_grant"`
	// RequestsPerGrant is every request the run sent Redis: the round
	// trips, and the subscription commands (SSUBSCRIBE, SUNSUBSCRIBE, by
	// INFO commandstats) that waiting callers' stores send over pub/sub
	// connections of their own, which the round trips do not see.
	RequestsPerGrant *float64 `json:"requests_per_grant"`
	// HoldExcessMicros is by how much a hold ran past the time it was
	// meant to last, on average (µs): the harness's clock and scheduling.
	// Nil when no hold lasted more than zero.
	HoldExcessMicros *float64 `json:"hold_excess_us"`
	// Commands counts Redis commands by name over the run.
	Commands map[string]int64 `json:"commands,omitempty"`
	// GrantLatency is over granted calls, CallLatency over all calls, each
	// call on its own. TimeToGrant is over grants, from the start of the
	// caller's first call for it, so calls that found no slot and the
	// pauses after them count too (and callers left waiting at the end,
	// with their wait so far; see Counts.Waiting).
	GrantLatency Latency `json:"grant_latency_ms"`
	CallLatency  Latency `json:"call_latency_ms"`
	TimeToGrant  Latency `json:"time_to_grant_ms"`
	Audit        Audit   `json:"audit"`
	// Fairness is how the grants spread over the callers.
	Fairness   Fairness `json:"fairness"`
	FirstError string   `json:"first_error,omitempty"`
}

// Fairness is the spread of grants over a run's callers.
type Fairness struct {
	Callers int `json:"callers"`
	// Min and Max are the fewest and most grants of one caller; Starved
	// counts the callers with none.
	Min     int64 `json:"min_grants"`
	Max     int64 `json:"max_grants"`
	Starved int   `json:"starved"`
	// MaxOverMin is Max/Min: 1 is perfectly fair. Nil when a caller got
	// nothing (the ratio is infinite; see Starved) or there are no callers.
	MaxOverMin *float64 `json:"max_over_min"`
}

// FairnessOf is the spread of grants, one count per caller.
func FairnessOf(grants []int64) Fairness {
	f := Fairness{Callers: len(grants)}
	if len(grants) == 0 {
		return f
	}
	f.Min, f.Max = slices.Min(grants), slices.Max(grants)
	for _, n := range grants {
		if n == 0 {
			f.Starved++
		}
	}
	if f.Min > 0 {
		v := float64(f.Max) / float64(f.Min)
		f.MaxOverMin = &v
	}
	return f
}

// Counts are a run's raw totals; see workload.Result.
type Counts struct {
	Calls         int64 `json:"calls"`
	Grants        int64 `json:"grants"`
	NoSlot        int64 `json:"no_slot"`
	GiveUps       int64 `json:"give_ups"`
	Errors        int64 `json:"errors"`
	Attempts      int64 `json:"attempts"`
	Conflicts     int64 `json:"conflicts"`
	Pruned        int64 `json:"pruned"`
	Released      int64 `json:"released"`
	Crashed       int64 `json:"crashed"`
	Lost          int64 `json:"lost"`
	ReleaseErrors int64 `json:"release_errors"`
	Offered       int64 `json:"offered,omitempty"`
	Waiting       int64 `json:"waiting"`
	ShortHolds    int64 `json:"short_holds"`
}

// Latency percentiles in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
}

// Audit is the oversell audit of one run.
type Audit struct {
	// HolderViolations counts grants after which the harness's own holder
	// count of the key exceeded its limit (or the key was not a candidate).
	HolderViolations int64 `json:"holder_violations"`
	// MaxHolders is the highest holder count of one key at any grant.
	MaxHolders int64 `json:"max_holders"`
	// StateViolations counts the times a key was found with more live
	// leases than the limit (or missing) in the store's own state: after
	// the run, and in each of the Samples read during a run whose callers
	// hold for zero.
	StateViolations int `json:"state_violations"`
	// Samples is how many reads of the store's state answered during the
	// run (every 20 ms, of up to 256 keys each, in turn, when callers hold
	// for zero: their holds are too short for the harness's count of
	// holders to see leases overlap).
	Samples int `json:"samples,omitempty"`
	// First describes the first violation found.
	First string `json:"first,omitempty"`
}

// OK reports whether the audit found nothing.
func (a Audit) OK() bool { return a.HolderViolations == 0 && a.StateViolations == 0 }

// Add adds b's findings to a's.
func (a *Audit) Add(b Audit) {
	a.HolderViolations += b.HolderViolations
	a.MaxHolders = max(a.MaxHolders, b.MaxHolders)
	a.StateViolations += b.StateViolations
	a.Samples += b.Samples
	if a.First == "" {
		a.First = b.First
	}
}

// Failed reports whether any run failed its audit.
func (r *Report) Failed() bool {
	for _, run := range r.Runs {
		if !run.Audit.OK() {
			return true
		}
	}
	return false
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Files written by WriteFiles, relative to its directory.
const (
	JSONFile     = "results.json"
	CSVFile      = "results.csv"
	MarkdownFile = "summary.md"
	PlotDir      = "plots"
)

// WriteFiles writes the JSON, CSV, Markdown summary and plots into dir,
// creating it, and returns the paths written.
func (r *Report) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var written []string
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{{JSONFile, r.WriteJSON}, {CSVFile, r.WriteCSV}, {MarkdownFile, r.WriteMarkdown}} {
		path := filepath.Join(dir, f.name)
		if err := writeFile(path, f.write); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	plots, err := r.WritePlots(filepath.Join(dir, PlotDir))
	return append(written, plots...), err
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("report: write %s: %w", path, err)
	}
	return nil
}
