package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/credpool/credpool/client"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

const adminUsage = `usage:
  credpool keys list                    every key, never a secret
  credpool keys get ID
  credpool keys put ID --provider P --models M[,M...] [--pool default] [--limit 1]
                       [--status available] [--secret-file FILE|-]
  credpool keys update ID [--status S [--cooldown-until T]] [--limit N] [--pool P] [--models M[,M...]]
                                        change only the fields given, never the secret
  credpool keys delete ID
  credpool keys clear-leases ID         force-release every lease of the key
  credpool keys import FILE|- [--format csv|jsonl] [--dry-run] [--update-secrets]
  credpool aliases list                 every alias
  credpool aliases set PROVIDER ALIAS MODEL
                                        requests for ALIAS get keys serving MODEL;
                                        an alias comes before a model of its name
  credpool aliases delete PROVIDER ALIAS

Every command takes:
  --url URL              the service (CREDPOOL_URL; default http://127.0.0.1:8080)
  --admin-key-file FILE  a file holding the admin key; without it the key is
                         read from CREDPOOL_ADMIN_KEY (never from the command line)
  -o table|json          output (default table)
  --timeout D            bound on the whole command (default 5m)

put replaces the whole key: a flag left out takes its default. The secret
is read from --secret-file, or from standard input (without echo on a
terminal); it is never printed.

A write that got no answer says "outcome unknown": it may have been
applied (check with keys get or keys list). "unreachable": no connection,
nothing sent. Ctrl-C stops a command (exit 130; SIGTERM 143); an import
finishes the batch in flight first, and says how far it got (a second
Ctrl-C abandons that batch).

import reads CSV with a header row (columns id, provider, pool, models,
secret, max_concurrent_uses, status; id, provider, models and secret
required; models separated by spaces; no comment lines) or JSON lines
(the same names, models an array). Every row is checked before any is
written; a bad row is named by its line and nothing is written. Up to
1,000 keys are written in one request, all or none; a larger import is
sent in batches of 1,000, and a batch that fails leaves the earlier ones
written (run it again to write the rest). Rows whose key already has
the same provider, pool, models, status and limit are left alone, so a
second run changes nothing: the secret is not compared, since the service
never shows it (--update-secrets writes every row). An empty status or
limit keeps an existing key's (new keys: available, 1); an empty pool is
"default".
`

// cli is where an admin command reads and writes; tests give their own.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// http sends the admin requests; nil: the client's default.
	http *http.Client
	// interrupts are SIGINT and SIGTERM (see watch); nil: none come.
	// unwatched, if set, gives them back their default action (the next
	// one kills), once two have come.
	interrupts <-chan os.Signal
	unwatched  func()
}

// runAdmin runs "credpool keys …" or "credpool aliases …".
func runAdmin(cmd string, args []string) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	stop := sync.OnceFunc(func() { signal.Stop(sigs) })
	defer stop()
	return cli{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, interrupts: sigs, unwatched: stop}.run(cmd, args)
}

// interrupted is the cause of a command's ctx that a signal ended.
type interrupted struct{ sig os.Signal }

func (e *interrupted) Error() string {
	if e.sig == syscall.SIGTERM {
		return "terminated (SIGTERM)"
	}
	return "interrupted (SIGINT)"
}

// name is the signal's name: SIGTERM or SIGINT.
func (e *interrupted) name() string {
	if e.sig == syscall.SIGTERM {
		return "SIGTERM"
	}
	return "SIGINT"
}

// exitCode is the status a shell gives a command that sig killed: 128
// and its number (130 for SIGINT, 143 for SIGTERM).
func (e *interrupted) exitCode() int {
	if e.sig == syscall.SIGTERM {
		return 128 + int(syscall.SIGTERM)
	}
	return 128 + int(syscall.SIGINT)
}

// watch returns ctx and batches, ctx's parent: the first interrupt ends
// ctx, the second batches, each with an *interrupted cause. Every request
// goes under ctx but an import's batches, under batches: one in flight at
// the first interrupt is finished (it is written all or none), the second
// abandons it. After the second, the signals get their default action
// back (see cli.unwatched): a third kills the command if it is stuck.
func (c cli) watch(parent context.Context) (ctx, batches context.Context, cancel context.CancelFunc) {
	batches, abandon := context.WithCancelCause(parent)
	ctx, stop := context.WithCancelCause(batches)
	go func() {
		for _, end := range []context.CancelCauseFunc{stop, abandon} {
			select {
			case sig := <-c.interrupts:
				end(&interrupted{sig})
			case <-batches.Done():
				return
			}
		}
		// Two asked it to stop: a third, if it is stuck, kills it.
		if c.unwatched != nil {
			c.unwatched()
		}
	}()
	return ctx, batches, func() { abandon(nil) }
}

func (c cli) run(cmd string, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, adminUsage)
		return errors.New("want a subcommand")
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(c.stdout, adminUsage)
		return nil
	}
	sub := cmd + " " + args[0]
	fs := flag.NewFlagSet("credpool "+sub, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() { fmt.Fprint(c.stderr, adminUsage) }
	var common commonFlags
	common.register(fs, c.getenv)
	var put putFlags
	var upd updateFlags
	var imp importFlags
	switch sub {
	case "keys put":
		put.register(fs)
	case "keys update":
		upd.register(fs)
	case "keys import":
		imp.register(fs)
	}
	n, ok := map[string]int{
		"keys list": 0, "keys get": 1, "keys put": 1, "keys update": 1, "keys delete": 1, "keys clear-leases": 1,
		"keys import": 1, "aliases list": 0, "aliases set": 3, "aliases delete": 2,
	}[sub]
	if !ok {
		fmt.Fprint(c.stderr, adminUsage)
		return fmt.Errorf("unknown command %q", "credpool "+sub)
	}
	pos, err := parseInterspersed(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(pos) != n {
		return fmt.Errorf("credpool %s: want %d argument(s), got %d", sub, n, len(pos))
	}
	var update client.KeyUpdate
	if sub == "keys update" {
		if update, err = upd.update(fs); err != nil {
			return err
		}
	}
	adm, err := common.admin(c.getenv, c.http)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), common.timeout)
	defer cancel()
	ctx, batches, unwatch := c.watch(ctx)
	defer unwatch()
	err = c.dispatch(ctx, batches, adm, sub, pos, put, update, imp, output{w: c.stdout, json: common.output == "json"})
	// What an interrupt cut short says so first; it decides the exit
	// status.
	var stopped *interrupted
	if err != nil && errors.As(context.Cause(ctx), &stopped) {
		err = fmt.Errorf("%w: %w", stopped, err)
	}
	return err
}

// dispatch runs subcommand sub. A write whose answer was lost says so: it
// may have been applied.
func (c cli) dispatch(ctx, batches context.Context, adm *client.Admin, sub string, pos []string, put putFlags, update client.KeyUpdate, imp importFlags, out output) error {
	switch sub {
	case "keys list":
		keys, err := adm.Keys(ctx)
		if err != nil {
			return err
		}
		return out.keys(keys)
	case "keys get":
		k, err := adm.Key(ctx, pos[0])
		if err != nil {
			return err
		}
		return out.key(k)
	case "keys put":
		return outcomeUnknown(c.put(ctx, adm, out, pos[0], put),
			"check with credpool keys get "+pos[0]+" (or put it again: a put replaces the whole key)")
	case "keys update":
		k, err := adm.UpdateKey(ctx, pos[0], update)
		if err != nil {
			return outcomeUnknown(err, "check with credpool keys get "+pos[0]+" (or send the update again)")
		}
		return out.key(k)
	case "keys delete":
		if err := adm.DeleteKey(ctx, pos[0]); err != nil {
			return outcomeUnknown(err, "check with credpool keys get "+pos[0])
		}
		return out.result(map[string]any{"deleted": pos[0]}, "deleted "+pos[0])
	case "keys clear-leases":
		n, err := adm.ClearLeases(ctx, pos[0])
		if err != nil {
			return outcomeUnknown(err, "check the live leases with credpool keys get "+pos[0])
		}
		return out.result(map[string]any{"cleared": n}, fmt.Sprintf("cleared %d lease(s) of %s", n, pos[0]))
	case "keys import":
		return c.importKeys(ctx, batches, adm, out, pos[0], imp)
	case "aliases list":
		all, err := adm.Aliases(ctx)
		if err != nil {
			return err
		}
		return out.aliases(all)
	case "aliases set":
		if err := adm.SetAlias(ctx, pos[0], pos[1], pos[2]); err != nil {
			return outcomeUnknown(err, "check with credpool aliases list (setting an alias twice is harmless)")
		}
		return out.result(client.Alias{Provider: pos[0], Alias: pos[1], Model: pos[2]},
			fmt.Sprintf("%s/%s → %s", pos[0], pos[1], pos[2]))
	default: // aliases delete
		if err := adm.DeleteAlias(ctx, pos[0], pos[1]); err != nil {
			return outcomeUnknown(err, "check with credpool aliases list")
		}
		return out.result(map[string]any{"provider": pos[0], "deleted": pos[1]},
			fmt.Sprintf("deleted alias %s of %s", pos[1], pos[0]))
	}
}

// outcomeUnknown adds to err, if a write's answer was lost, that the
// write may have been applied, and how to find out.
func outcomeUnknown(err error, check string) error {
	if errors.Is(err, client.ErrOutcomeUnknown) {
		return fmt.Errorf("%w; the write may or may not have been applied: %s", err, check)
	}
	return err
}

// parseInterspersed parses flags wherever they stand among the
// positional arguments ("keys get ID -o json").
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// commonFlags are every admin command's.
type commonFlags struct {
	url, keyFile, output string
	timeout              time.Duration
}

func (f *commonFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	url := getenv("CREDPOOL_URL")
	if url == "" {
		url = "http://127.0.0.1:8080"
	}
	fs.StringVar(&f.url, "url", url, "the service's base URL (env CREDPOOL_URL)")
	fs.StringVar(&f.keyFile, "admin-key-file", "", "a file holding the admin key (default: env CREDPOOL_ADMIN_KEY)")
	fs.StringVar(&f.output, "o", "table", "output: table or json")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "bound on the whole command")
}

// admin checks the flags and returns the admin client, sending through hc
// (nil: the client's default).
func (f *commonFlags) admin(getenv func(string) string, hc *http.Client) (*client.Admin, error) {
	if f.output != "table" && f.output != "json" {
		return nil, errors.New("-o: want table or json")
	}
	if f.timeout <= 0 {
		return nil, errors.New("--timeout: want a positive duration")
	}
	key := getenv("CREDPOOL_ADMIN_KEY")
	if f.keyFile != "" {
		raw, err := os.ReadFile(f.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--admin-key-file: %w", err)
		}
		key = strings.TrimSpace(string(raw))
	}
	if key == "" {
		return nil, errors.New("no admin key: set CREDPOOL_ADMIN_KEY or --admin-key-file")
	}
	// A request may take the whole command's time (a batch of 1,000 keys
	// on a busy service): the client's own 15 s bound would cut it and
	// leave its outcome unknown.
	return client.NewAdmin(f.url, key, &client.Options{HTTPClient: hc, Timeout: f.timeout})
}

// output writes results as a table (text) or JSON.
type output struct {
	w    io.Writer
	json bool
}

func (o output) result(v any, text string) error {
	if o.json {
		return json.NewEncoder(o.w).Encode(v)
	}
	_, err := fmt.Fprintln(o.w, text)
	return err
}

func (o output) key(k client.Key) error {
	if o.json {
		return json.NewEncoder(o.w).Encode(k)
	}
	return o.keys([]client.Key{k})
}

func (o output) keys(keys []client.Key) error {
	if o.json {
		return json.NewEncoder(o.w).Encode(keys)
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	// New columns go before MODELS, which holds spaces and stays last,
	// so that a script reading columns by position keeps working.
	fmt.Fprintln(tw, "ID\tPROVIDER\tPOOL\tSTATUS\tLIMIT\tLIVE\tSUCCESSES\tERRORS\tHELD_UNTIL\tMODELS")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", k.ID, k.Provider, k.Pool, k.Status,
			k.MaxConcurrentUses, k.LiveLeases, k.Successes, k.Errors, heldUntil(k), strings.Join(k.Models, " "))
	}
	return tw.Flush()
}

// heldUntil is the HELD_UNTIL cell: when a key held back after a lease
// store lost its leases grants again (whatever its status says), or "-".
func heldUntil(k client.Key) string {
	if k.HeldUntil == nil {
		return "-"
	}
	return k.HeldUntil.UTC().Format(time.RFC3339)
}

func (o output) aliases(all []client.Alias) error {
	if o.json {
		return json.NewEncoder(o.w).Encode(all)
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tALIAS\tMODEL")
	for _, a := range all {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", a.Provider, a.Alias, a.Model)
	}
	return tw.Flush()
}

// putFlags are "keys put"'s.
type putFlags struct {
	provider, pool, models, status, secretFile string
	limit                                      int
}

func (f *putFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.provider, "provider", "", "the provider (required)")
	fs.StringVar(&f.pool, "pool", "default", "the pool")
	fs.StringVar(&f.models, "models", "", "the models the key serves, separated by commas or spaces (required)")
	fs.StringVar(&f.status, "status", "available", "available, pending, disabled, exhausted, rate_limited or cooldown")
	fs.IntVar(&f.limit, "limit", 1, "max_concurrent_uses")
	fs.StringVar(&f.secretFile, "secret-file", "", "a file holding the secret, - for standard input (default: standard input)")
}

// updateFlags are "keys update"'s: only those given are sent.
type updateFlags struct {
	pool, models, status, cooldownUntil string
	limit                               int
}

func (f *updateFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.pool, "pool", "", "the pool")
	fs.StringVar(&f.models, "models", "", "the models the key serves, separated by commas or spaces")
	fs.StringVar(&f.status, "status", "", "available, pending, disabled, exhausted, rate_limited or cooldown")
	fs.StringVar(&f.cooldownUntil, "cooldown-until", "", "with --status rate_limited or cooldown: when it ends (RFC 3339)")
	fs.IntVar(&f.limit, "limit", 0, "max_concurrent_uses")
}

// update is the change the flags fs parsed ask for.
func (f *updateFlags) update(fs *flag.FlagSet) (client.KeyUpdate, error) {
	var u client.KeyUpdate
	var err error
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "pool":
			u.Pool = &f.pool
		case "models":
			u.Models = splitModels(f.models)
			if len(u.Models) == 0 {
				err = errors.New("--models: want at least one model")
			}
		case "status":
			u.Status = &f.status
		case "cooldown-until":
			t, perr := time.Parse(time.RFC3339, f.cooldownUntil)
			if perr != nil {
				err = errors.New("--cooldown-until: want an RFC 3339 time, e.g. 2026-12-01T15:04:05Z")
			}
			u.CooldownUntil = &t
		case "limit":
			u.MaxConcurrentUses = &f.limit
		}
	})
	if err == nil && u.Pool == nil && u.Models == nil && u.Status == nil && u.CooldownUntil == nil && u.MaxConcurrentUses == nil {
		err = errors.New("credpool keys update: want a flag to change: --status, --limit, --pool or --models (the secret changes only by put)")
	}
	return u, err
}

func (c cli) put(ctx context.Context, adm *client.Admin, out output, id string, f putFlags) error {
	r := row{
		ID: id, Provider: f.provider, Pool: f.pool, Status: f.status, Limit: strconv.Itoa(f.limit),
		Models: splitModels(f.models),
	}
	if problems := r.check(); len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	secret, err := c.readSecret(ctx, id, f.secretFile)
	if err != nil {
		return fmt.Errorf("%w; nothing written", err)
	}
	r.Secret = secret
	k, err := adm.PutKey(ctx, id, r.spec(nil))
	if err != nil {
		return err
	}
	return out.key(k)
}

// readSecret reads a secret from path, or from standard input ("" or
// "-"): prompted for without echo on a terminal. Surrounding whitespace
// is dropped; an empty secret is refused.
func (c cli) readSecret(ctx context.Context, id, path string) (client.Secret, error) {
	var raw []byte
	var err error
	switch f, ok := c.stdin.(*os.File); {
	case path != "" && path != "-":
		raw, err = unlessDone(ctx, func() ([]byte, error) { return os.ReadFile(path) })
	case ok && term.IsTerminal(int(f.Fd())):
		raw, err = c.prompt(ctx, int(f.Fd()), id)
	default:
		raw, err = unlessDone(ctx, func() ([]byte, error) { return io.ReadAll(io.LimitReader(c.stdin, 64<<10)) })
	}
	if err != nil {
		return "", fmt.Errorf("read the secret: %w", err)
	}
	secret := strings.TrimSpace(string(raw))
	if secret == "" {
		return "", errors.New("the secret is empty")
	}
	return client.Secret(secret), nil
}

// unlessDone returns what read reads, unless ctx ends first (an
// interrupt while a pipe or FIFO has no writer): then ctx's error, and
// read is left blocked until the process exits, which it then does.
func unlessDone(ctx context.Context, read func() ([]byte, error)) ([]byte, error) {
	type result struct {
		raw []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		raw, err := read()
		done <- result{raw, err}
	}()
	select {
	case r := <-done:
		return r.raw, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// prompt asks for the secret of id on terminal fd and reads it without
// echo. If ctx ends first (an interrupt) it puts the terminal back as it
// found it, echo on, and returns ctx's error; the read is left blocked
// until the process exits, which it then does.
func (c cli) prompt(ctx context.Context, fd int, id string) ([]byte, error) {
	state, err := term.GetState(fd)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// Over already (--timeout, an early interrupt): a read started now
		// could turn echo off after the restore below.
		return nil, err
	}
	fmt.Fprintf(c.stderr, "secret of %s: ", id)
	type read struct {
		raw []byte
		err error
	}
	done := make(chan read, 1)
	go func() {
		raw, err := term.ReadPassword(fd)
		done <- read{raw, err}
	}()
	select {
	case r := <-done:
		fmt.Fprintln(c.stderr)
		return r.raw, r.err
	case <-ctx.Done():
		// A secret half typed when a signal (not a typed Ctrl-C, which the
		// terminal flushes itself) or --timeout ended the prompt would go
		// to the shell next.
		err := errors.Join(discardInput(fd), term.Restore(fd, state))
		fmt.Fprintln(c.stderr)
		return nil, errors.Join(ctx.Err(), err)
	}
}

// importFlags are "keys import"'s.
type importFlags struct {
	format        string
	dryRun        bool
	updateSecrets bool
}

func (f *importFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.format, "format", "", "csv or jsonl (default: by the file's extension; csv for standard input)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "check the file and show what would change; write nothing")
	fs.BoolVar(&f.updateSecrets, "update-secrets", false, "write every row, also those that match (to rotate secrets)")
}

// row is one key of an import file, as read, before any default.
type row struct {
	Line     int
	ID       string
	Provider string
	Pool     string
	Models   []string
	// Secret is never printed: client.Secret redacts itself.
	Secret client.Secret
	Status string
	// Limit is max_concurrent_uses as written; empty keeps (or defaults).
	Limit string
}

// check returns what is wrong with r but its secret (read apart), naming
// columns, never quoting a value: a secret pasted into the wrong column
// must not be printed.
func (r row) check() []string {
	var out []string
	for _, f := range []struct{ name, v string }{{"id", r.ID}, {"provider", r.Provider}, {"pool", r.Pool}} {
		switch {
		case f.v == "":
			out = append(out, f.name+": required")
		case !optimistic.ValidID(f.v):
			out = append(out, f.name+": want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit")
		}
	}
	if len(r.Models) == 0 {
		out = append(out, "models: want at least one")
	}
	for _, m := range r.Models {
		if catalog.CheckModel("models", m) != nil {
			out = append(out, "models: want 1-256 characters each, no control characters")
			break
		}
	}
	if r.Status != "" && !optimistic.Status(r.Status).Valid() {
		out = append(out, "status: want available, pending, disabled, exhausted, rate_limited or cooldown")
	}
	if n, err := strconv.Atoi(r.Limit); r.Limit != "" && (err != nil || n < 1) {
		out = append(out, "max_concurrent_uses: want a whole number, at least 1")
	}
	return out
}

// spec is what PutKey writes for r; old is the key as stored, if any,
// whose status, limit, cooldown and last verification r keeps unless it
// sets them.
func (r row) spec(old *client.Key) client.KeySpec {
	s := client.KeySpec{Provider: r.Provider, Pool: r.Pool, Models: r.Models, Secret: r.Secret, Status: r.Status}
	s.MaxConcurrentUses, _ = strconv.Atoi(r.Limit)
	if old == nil {
		return s
	}
	if s.Status == "" {
		s.Status = old.Status
	}
	if s.MaxConcurrentUses == 0 {
		s.MaxConcurrentUses = old.MaxConcurrentUses
	}
	if old.CooldownUntil != nil && (s.Status == "rate_limited" || s.Status == "cooldown") {
		s.CooldownUntil = *old.CooldownUntil
	}
	if old.LastVerifiedAt != nil {
		s.LastVerifiedAt = *old.LastVerifiedAt
	}
	return s
}

// matches reports whether the stored key already is what r asks for, in
// every field the admin API shows.
func (r row) matches(k client.Key) bool {
	s := r.spec(&k)
	return k.Provider == s.Provider && k.Pool == s.Pool && k.Status == s.Status &&
		k.MaxConcurrentUses == s.MaxConcurrentUses && slices.Equal(setOf(k.Models), setOf(s.Models))
}

func setOf(models []string) []string {
	return slices.Compact(slices.Sorted(slices.Values(models)))
}

// readRows reads an import file: every row, or every problem, each named
// by its line.
func readRows(in io.Reader, format string) ([]row, []string, error) {
	var rows []row
	var err error
	if format == "jsonl" {
		rows, err = readJSONLines(in)
	} else {
		rows, err = readCSV(in)
	}
	if err != nil {
		return nil, nil, err
	}
	var problems []string
	seen := map[string]int{}
	for i := range rows {
		r := &rows[i]
		if r.Pool == "" {
			r.Pool = "default"
		}
		rp := r.check()
		if r.Secret == "" {
			rp = append(rp, "secret: required")
		}
		for _, p := range rp {
			problems = append(problems, fmt.Sprintf("line %d: %s", r.Line, p))
		}
		if first, ok := seen[r.ID]; ok && r.ID != "" {
			problems = append(problems, fmt.Sprintf("line %d: id: repeats line %d", r.Line, first))
		} else {
			seen[r.ID] = r.Line
		}
	}
	if len(rows) == 0 && len(problems) == 0 {
		problems = append(problems, "no rows")
	}
	return rows, problems, nil
}

// csvColumns are the columns an import CSV may have.
var csvColumns = []string{"id", "provider", "pool", "models", "secret", "max_concurrent_uses", "status"}

// readCSV reads an import CSV. It has no comment lines: a row whose id
// starts with # is a row, and its id is refused like any bad id.
func readCSV(in io.Reader) ([]row, error) {
	cr := csv.NewReader(in)
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("CSV header: %w", err)
	}
	if len(header) > 0 {
		// Spreadsheets save UTF-8 with a byte order mark.
		header[0] = strings.TrimPrefix(header[0], "\ufeff")
	}
	col := map[string]int{}
	for i, h := range header {
		h = strings.ToLower(strings.TrimSpace(h))
		if !slices.Contains(csvColumns, h) {
			return nil, fmt.Errorf("CSV header: unknown column %d; want some of %s", i+1, strings.Join(csvColumns, ", "))
		}
		col[h] = i
	}
	for _, h := range []string{"id", "provider", "models", "secret"} {
		if _, ok := col[h]; !ok {
			return nil, fmt.Errorf("CSV header: no %s column", h)
		}
	}
	get := func(rec []string, name string) string {
		if i, ok := col[name]; ok {
			return strings.TrimSpace(rec[i])
		}
		return ""
	}
	var rows []row
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return rows, nil
		}
		if err != nil {
			// csv's errors name the line and column, never the value.
			return nil, err
		}
		line, _ := cr.FieldPos(0)
		rows = append(rows, row{
			Line: line, ID: get(rec, "id"), Provider: get(rec, "provider"), Pool: get(rec, "pool"),
			Models: splitModels(get(rec, "models")), Secret: client.Secret(get(rec, "secret")),
			Status: get(rec, "status"), Limit: get(rec, "max_concurrent_uses"),
		})
	}
}

func readJSONLines(in io.Reader) ([]row, error) {
	raw, err := io.ReadAll(in)
	if err != nil {
		return nil, err
	}
	var rows []row
	for i, line := range bytes.Split(raw, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var v struct {
			ID                string   `json:"id"`
			Provider          string   `json:"provider"`
			Pool              string   `json:"pool"`
			Models            []string `json:"models"`
			Secret            string   `json:"secret"`
			MaxConcurrentUses *int     `json:"max_concurrent_uses"`
			Status            string   `json:"status"`
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("line %d: %s", i+1, jsonLineProblem(err))
		}
		r := row{Line: i + 1, ID: v.ID, Provider: v.Provider, Pool: v.Pool, Models: v.Models, Secret: client.Secret(v.Secret), Status: v.Status}
		if v.MaxConcurrentUses != nil {
			r.Limit = strconv.Itoa(*v.MaxConcurrentUses)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// jsonLineProblem says what is wrong with a JSON line, naming the field
// where the decoder does; never in the decoder's words, which can quote a
// value (a secret).
func jsonLineProblem(err error) string {
	var wrongType *json.UnmarshalTypeError
	switch {
	case errors.As(err, &wrongType) && wrongType.Field != "":
		want := map[string]string{"models": "an array of strings", "max_concurrent_uses": "a number"}[wrongType.Field]
		return fmt.Sprintf("field %s: want %s", wrongType.Field, cmp.Or(want, "a string"))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Sprintf("unknown field %s; want id, provider, pool, models, secret, max_concurrent_uses, status",
			strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return "want one JSON object of id, provider, pool, models, secret, max_concurrent_uses, status"
}

// importPlan is what an import writes.
type importPlan struct {
	Created   []string `json:"created"`
	Updated   []string `json:"updated"`
	Unchanged int      `json:"unchanged"`
	DryRun    bool     `json:"dry_run,omitempty"`
}

// importKeys runs "keys import". Its batches go under batches, its other
// requests under ctx, and once ctx is done no batch starts (see putAll).
func (c cli) importKeys(ctx, batches context.Context, adm *client.Admin, out output, path string, f importFlags) error {
	format := f.format
	if format == "" {
		format = "csv"
		if ext := strings.ToLower(filepath.Ext(path)); ext == ".jsonl" || ext == ".ndjson" || ext == ".json" {
			format = "jsonl"
		}
	}
	if format != "csv" && format != "jsonl" {
		return errors.New("--format: want csv or jsonl")
	}
	raw, err := unlessDone(ctx, func() ([]byte, error) {
		if path == "-" {
			return io.ReadAll(c.stdin)
		}
		return os.ReadFile(path)
	})
	if err != nil {
		return err
	}
	rows, problems, err := readRows(bytes.NewReader(raw), format)
	if err != nil {
		return fmt.Errorf("%s: %w; nothing written", path, err)
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(c.stderr, p)
		}
		return fmt.Errorf("%s: %d problem(s) in %d row(s); nothing written", path, len(problems), len(rows))
	}

	keys, err := adm.Keys(ctx)
	if err != nil {
		return err
	}
	stored := map[string]*client.Key{}
	for i := range keys {
		stored[keys[i].ID] = &keys[i]
	}
	plan := importPlan{Created: []string{}, Updated: []string{}, DryRun: f.dryRun}
	var writes []row
	for _, r := range rows {
		old := stored[r.ID]
		switch {
		case old == nil:
			plan.Created = append(plan.Created, r.ID)
		case !r.matches(*old):
			plan.Updated = append(plan.Updated, r.ID)
		case f.updateSecrets:
			plan.Updated = append(plan.Updated, r.ID)
		default:
			plan.Unchanged++
			continue
		}
		writes = append(writes, r)
	}
	if !f.dryRun {
		if err := putAll(ctx, batches, c.stderr, adm, writes, stored); err != nil {
			return err
		}
	}
	return out.plan(plan)
}

// putAll writes rows in batches of client.MaxPutKeys, one request each
// under batches, which the service writes whole or not at all. It stops
// at the first failure, or before the next batch once stop is done (an
// interrupt: the batch in flight is finished, and stderr says so), and
// says how far it got: a rerun finishes the job, since rows already
// written then match.
func putAll(stop, batches context.Context, stderr io.Writer, adm *client.Admin, rows []row, stored map[string]*client.Key) error {
	for start := 0; start < len(rows); start += client.MaxPutKeys {
		batch := rows[start:min(start+client.MaxPutKeys, len(rows))]
		first, last := batch[0].Line, batch[len(batch)-1].Line
		if stop.Err() != nil {
			return fmt.Errorf("stopped before line %d: wrote %d of %d keys; run the import again to write the rest (keys already written match and are left alone)",
				first, start, len(rows))
		}
		keys := make([]client.KeyPut, len(batch))
		for i, r := range batch {
			keys[i] = client.KeyPut{ID: r.ID, KeySpec: r.spec(stored[r.ID])}
		}
		told := make(chan struct{})
		tell := context.AfterFunc(stop, func() {
			defer close(told)
			var sig *interrupted
			if errors.As(context.Cause(stop), &sig) {
				fmt.Fprintf(stderr, "credpool: %v: finishing lines %d to %d, written all or none; interrupt again to abandon them\n",
					sig, first, last)
			}
		})
		err := adm.PutKeys(batches, keys)
		if !tell() {
			<-told
		}
		var refused *client.Error
		switch {
		case err == nil:
			continue
		case errors.As(err, &refused) && refused.StatusCode < 500 && start == 0:
			return fmt.Errorf("%w; nothing written", err)
		case errors.As(err, &refused) && refused.StatusCode < 500:
			return fmt.Errorf("wrote %d of %d keys, then lines %d to %d: %w; none of them written",
				start, len(rows), first, last, err)
		}
		// No answer, or a 503 that may come after the write (the lease
		// store's sync): the batch is written whole or not at all.
		return fmt.Errorf("wrote %d of %d keys, then lines %d to %d: %w; they are written all or none (credpool keys list shows which): run the import again to finish (and POST /api/admin/sync if the lease store failed)",
			start, len(rows), first, last, err)
	}
	return nil
}

func (o output) plan(p importPlan) error {
	if o.json {
		return json.NewEncoder(o.w).Encode(p)
	}
	verb := ""
	if p.DryRun {
		verb = "would be "
	}
	if len(p.Created)+len(p.Updated) == 0 {
		_, err := fmt.Fprintf(o.w, "nothing to change: all %d key(s) already match (secrets are not compared; --update-secrets writes them)\n", p.Unchanged)
		return err
	}
	_, err := fmt.Fprintf(o.w, "%d key(s) %screated, %d %supdated, %d unchanged\n",
		len(p.Created), verb, len(p.Updated), verb, p.Unchanged)
	return err
}

// splitModels splits a list of models at commas and spaces, as --models
// and a CSV file's models cell give them.
func splitModels(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}
