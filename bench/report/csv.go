package report

import (
	"encoding/csv"
	"io"
	"strconv"
)

// csvHeader names WriteCSV's columns; per-grant figures are empty where
// the JSON has null (max_over_min_grants also where a caller got none:
// infinite). p50_ms to max_ms are the per-call latency of granted calls,
// ttg_* the time to grant; wait is empty for retrying callers.
var csvHeader = []string{
	"strategy", "rep", "scenario", "loop", "rate", "keys", "limit", "candidates", "choice", "order", "workers", "procs",
	"hold", "hold_dist", "duration", "pause", "wait", "crash_share", "elapsed_s",
	"calls", "grants", "no_slot", "give_ups", "errors", "attempts", "conflicts", "released", "crashed", "lost", "waiting",
	"grants_per_s", "no_slot_per_s", "give_ups_per_s", "errors_per_s",
	"conflicts_per_grant", "attempts_per_grant", "round_trips_per_grant", "requests_per_grant", "commands_per_grant",
	"p50_ms", "p90_ms", "p99_ms", "p99_9_ms", "max_ms",
	"ttg_p50_ms", "ttg_p90_ms", "ttg_p99_ms", "ttg_p99_9_ms", "ttg_max_ms",
	"hold_excess_us", "holder_violations", "max_holders", "state_violations",
	"callers", "min_grants_per_caller", "max_grants_per_caller", "starved_callers", "max_over_min_grants",
}

// WriteCSV writes one line per run.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	for _, run := range r.Runs {
		c, l, w, a, f := run.Counts, run.GrantLatency, run.TimeToGrant, run.Audit, run.Fairness
		if err := cw.Write([]string{
			run.Strategy, itoa(run.Rep), run.Scenario, run.Loop, ftoa(run.Rate), itoa(run.Keys), itoa(run.Limit), itoa(run.Candidates),
			run.Choice, run.Order, itoa(run.Workers), itoa(run.Procs), run.Hold, run.HoldDist, run.Duration, run.Pause, run.Wait,
			ftoa(run.CrashShare), ftoa(run.ElapsedSeconds),
			i64(c.Calls), i64(c.Grants), i64(c.NoSlot), i64(c.GiveUps), i64(c.Errors), i64(c.Attempts),
			i64(c.Conflicts), i64(c.Released), i64(c.Crashed), i64(c.Lost), i64(c.Waiting),
			ftoa(run.GrantsPerSec), ftoa(run.NoSlotPerSec), ftoa(run.GiveUpsPerSec), ftoa(run.ErrorsPerSec),
			optFtoa(run.ConflictsPerGrant), optFtoa(run.AttemptsPerGrant), optFtoa(run.RoundTripsPerGrant),
			optFtoa(run.RequestsPerGrant), optFtoa(run.CommandsPerGrant),
			ftoa(l.P50), ftoa(l.P90), ftoa(l.P99), ftoa(l.P999), ftoa(l.Max),
			ftoa(w.P50), ftoa(w.P90), ftoa(w.P99), ftoa(w.P999), ftoa(w.Max),
			optFtoa(run.HoldExcessMicros), i64(a.HolderViolations), i64(a.MaxHolders), itoa(a.StateViolations),
			itoa(f.Callers), i64(f.Min), i64(f.Max), itoa(f.Starved), optFtoa(f.MaxOverMin),
		}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func itoa(v int) string     { return strconv.Itoa(v) }
func i64(v int64) string    { return strconv.FormatInt(v, 10) }
func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
func optFtoa(v *float64) string {
	if v == nil {
		return ""
	}
	return ftoa(*v)
}
