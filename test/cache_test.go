package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/openapitest"
	"github.com/credpool/credpool/test/pgtest"
)

// The catalog is cached in memory on the request path (catalog.Cache), and
// still: a key disabled through the admin API is never granted to a
// request that starts after the admin call returned. 64 clients allocate
// and release in a loop while the key is disabled; on one service, and on
// two services sharing the catalog file and the lease store, with the
// disable sent to one and the requests spread over both. With direct, the
// disable is written to the catalog file by another process and never
// reaches the lease store: only the re-check after the grant, on the
// cache, stands between the key and the callers. With postgres the
// catalog is in PostgreSQL, as instances on several hosts share it. The
// disable is a PUT of the whole key, or a PATCH of its status alone.
func TestHTTPDisableUnderLoad(t *testing.T) {
	for _, tt := range []struct {
		name             string
		sqlite, postgres bool
		two              bool
		direct           bool
		// patch disables by PATCH (the status alone), not by a PUT.
		patch bool
	}{
		{"redis", false, false, false, false, false}, {"sqlite", true, false, false, false, false},
		{"redis, two services", false, false, true, false, false}, {"sqlite, two services", true, false, true, false, false},
		{"redis, catalog written elsewhere", false, false, false, true, false},
		{"sqlite, catalog written elsewhere", true, false, false, true, false},
		{"postgres, two services", false, true, true, false, false},
		{"postgres, catalog written elsewhere", false, true, false, true, false},
		{"redis, two services, by PATCH", false, false, true, false, true},
		{"sqlite, by PATCH", true, false, false, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var pg string
			if tt.postgres {
				pg = pgtest.URL(t)
			}
			a := startService(t, serviceOptions{sqlite: tt.sqlite, postgres: pg})
			services := []*service{a}
			if tt.two {
				services = append(services, startService(t, serviceOptions{sqlite: tt.sqlite, postgres: pg, dir: a.dir, redis: a.redis}))
			}
			for i := range 4 {
				a.putKey(t, fmt.Sprintf("k%d", i), "default", 5, nil)
			}

			type grant struct {
				key   string
				start time.Time
			}
			var (
				mu     sync.Mutex
				grants []grant
				errs   = make(chan error, 64)
				stop   = make(chan struct{})
				wg     sync.WaitGroup
			)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
			t.Cleanup(client.CloseIdleConnections)
			for i := range 64 {
				s := services[i%len(services)]
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						code, g, err := post(client, s.url+"/api/internal/allocate-key", internalKey, allocBody("default"))
						if err == nil && code == http.StatusOK {
							_, _, err = post(client, s.url+"/api/internal/release", internalKey, leaseBody(g))
						}
						if err != nil {
							errs <- err
							return
						}
						if code == http.StatusOK {
							id, _ := g["key_id"].(string)
							mu.Lock()
							grants = append(grants, grant{id, start})
							mu.Unlock()
						}
					}
				})
			}
			end := sync.OnceFunc(func() { close(stop) })
			defer end()
			// Waits for a grant that match accepts; a loaded machine can
			// take a while to serve any.
			granted := func(msg string, match func(grant) bool) {
				require.Eventually(t, func() bool {
					mu.Lock()
					defer mu.Unlock()
					return slices.ContainsFunc(grants, match)
				}, time.Minute, 10*time.Millisecond, msg)
			}
			granted("k0 granted before the disable", func(g grant) bool { return g.key == "k0" })
			switch {
			case tt.direct:
				disableElsewhere(t, a, "k0")
			case tt.patch:
				code, out := a.admin(t, http.MethodPatch, "keys/k0", map[string]any{"status": "disabled"})
				require.Equal(t, http.StatusOK, code, "%v", out)
			default:
				a.putKey(t, "k0", "default", 5, map[string]any{"status": "disabled"})
			}
			returned := time.Now()
			granted("other keys granted after it", func(g grant) bool { return g.key != "k0" && g.start.After(returned) })
			// More requests after the disable: more chances to grant k0.
			time.Sleep(300 * time.Millisecond)
			end()
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			var before, after, others int
			for _, g := range grants {
				switch {
				case g.key != "k0" && g.start.After(returned):
					others++
				case g.key != "k0":
				case g.start.After(returned):
					after++
				default:
					before++
				}
			}
			require.Positive(t, before, "k0 was in use before the disable")
			require.Positive(t, others, "the other keys are granted after it")
			require.Zero(t, after, "k0 granted to a request that started after the disable returned")
		})
	}
}

// post sends body as JSON with key as X-Internal-Key through c and
// decodes the answer; it reports errors (an exchange that does not match
// the OpenAPI document among them, see openapitest) instead of failing a test.
func post(c *http.Client, url, key string, body any) (int, map[string]any, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-Internal-Key", key)
	resp, err := openapitest.Client(c).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return resp.StatusCode, nil, err
	}
	return resp.StatusCode, out, nil
}

// disableElsewhere disables a key in s's catalog, through a connection of
// its own, as another process would: the lease store is not told.
func disableElsewhere(t *testing.T, s *service, id string) {
	t.Helper()
	sealer, err := catalog.NewSealer(bytes.Repeat([]byte{7}, 32))
	require.NoError(t, err)
	opts := &catalog.Options{Sealer: sealer}
	var c *catalog.SQL
	if s.pg != "" {
		db, err := postgres.Open(t.Context(), s.pg)
		require.NoError(t, err)
		defer db.Close()
		c, err = catalog.NewPostgres(t.Context(), db, opts)
		require.NoError(t, err)
	} else {
		db, err := sqlitex.Open(filepath.Join(s.dir, "credpool.db"))
		require.NoError(t, err)
		defer db.Close()
		c, err = catalog.New(t.Context(), db, opts)
		require.NoError(t, err)
	}
	k, err := c.Get(t.Context(), id)
	require.NoError(t, err)
	k.Status = optimistic.StatusDisabled
	_, err = c.Put(t.Context(), k)
	require.NoError(t, err)
}
