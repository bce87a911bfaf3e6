package catalog_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// The secret must not leak through any way a Key is commonly printed,
// logged or marshalled.
func TestSecretNeverPrinted(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		k := get(t, c, "k1")
		keys, err := c.List(t.Context(), "", "")
		require.NoError(t, err)

		var outputs []string
		for _, v := range []any{k, &k, keys, k.Secret} {
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
				outputs = append(outputs, fmt.Sprintf(verb, v))
			}
			b, err := json.Marshal(v)
			require.NoError(t, err)
			outputs = append(outputs, string(b))
		}
		for _, h := range []func(*bytes.Buffer) slog.Handler{
			func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
			func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		} {
			var buf bytes.Buffer
			log := slog.New(h(&buf))
			log.Info("key", "key", k, "ptr", &k, "keys", keys, "secret", k.Secret)
			log.Info("key", slog.Any("key", k), slog.Group("g", "secret", k.Secret))
			outputs = append(outputs, buf.String())
		}

		for _, out := range outputs {
			require.NotContains(t, out, secret)
			require.NotContains(t, out, fmt.Sprintf("%x", secret))
		}
		require.Contains(t, fmt.Sprint(k), "[redacted]")
		require.Equal(t, secret, k.Secret.Reveal())
		require.IsType(t, catalog.Secret(""), k.Secret)
	})
}

// A plaintext secret from before sealing that starts like a sealed one
// ("v1:") is not opened, and the error never quotes a part of it.
func TestPlaintextLikeSealedIsNeverQuoted(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "credpool.db"))
	plain, err := catalog.New(t.Context(), db, nil)
	require.NoError(t, err)
	k := testKey("k1")
	k.Secret = "v1:sk-live-TOPSECRET0123456789"
	put(t, plain, k)
	sealed, err := catalog.New(t.Context(), db, &catalog.Options{Sealer: sealer(t, key32(1))})
	require.NoError(t, err)
	_, err = sealed.Get(t.Context(), "k1")
	require.ErrorIs(t, err, catalog.ErrSecret)
	require.NotContains(t, err.Error(), "TOPSECRET")
	cc := newCache(t, sealed, nil)
	_, err = cc.Get(t.Context(), "k1")
	require.ErrorIs(t, err, catalog.ErrSecret)
	require.NotContains(t, err.Error(), "TOPSECRET")
}

func sealer(t *testing.T, current []byte, old ...[]byte) *catalog.Sealer {
	t.Helper()
	s, err := catalog.NewSealer(current, old...)
	require.NoError(t, err)
	return s
}

func key32(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// Secrets are sealed at rest: the database file never holds one in the
// clear, Get opens it, and keys rotate: Rekey seals the old ones (and
// plaintext ones from before sealing) with the current key.
func TestSecretsSealedAtRest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credpool.db")
	db := openDB(t, path)
	plain, err := catalog.New(t.Context(), db, nil)
	require.NoError(t, err)
	legacy := testKey("legacy")
	legacy.Secret = "sk-legacy-plaintext-0001"
	put(t, plain, legacy)

	oldKey, newKey := key32(1), key32(2)
	c, err := catalog.New(t.Context(), db, &catalog.Options{Sealer: sealer(t, oldKey)})
	require.NoError(t, err)
	put(t, c, testKey("k1"))
	require.Equal(t, secret, get(t, c, "k1").Secret.Reveal())
	require.Equal(t, "sk-legacy-plaintext-0001", get(t, c, "legacy").Secret.Reveal(), "plaintext from before still reads")

	// Rotation: the new key seals, the old one still opens.
	rotated, err := catalog.New(t.Context(), db, &catalog.Options{Sealer: sealer(t, newKey, oldKey)})
	require.NoError(t, err)
	require.Equal(t, secret, get(t, rotated, "k1").Secret.Reveal())
	n, skipped, err := rotated.Rekey(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, n, "k1 and the plaintext one")
	require.Empty(t, skipped)
	n, skipped, err = rotated.Rekey(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to seal")
	require.Empty(t, skipped)

	onlyNew, err := catalog.New(t.Context(), db, &catalog.Options{Sealer: sealer(t, newKey)})
	require.NoError(t, err)
	require.Equal(t, secret, get(t, onlyNew, "k1").Secret.Reveal(), "the old key is no longer needed")
	onlyOld, err := catalog.New(t.Context(), db, &catalog.Options{Sealer: sealer(t, oldKey)})
	require.NoError(t, err)
	_, err = onlyOld.Get(t.Context(), "k1")
	require.ErrorIs(t, err, optimistic.ErrStore, "a key that cannot open it is a store failure")
	require.NotContains(t, err.Error(), secret)

	// While db is open the WAL stays, as it does in a running service:
	// Rekey must have emptied it of the plaintext it appended earlier.
	wal, err := os.ReadFile(path + "-wal")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, s := range []string{secret, "sk-legacy-plaintext"} {
		require.False(t, bytes.Contains(raw, []byte(s)), "plaintext secret %q in the database file", s)
		require.False(t, bytes.Contains(wal, []byte(s)), "plaintext secret %q in the WAL", s)
	}
}

// A secret Rekey cannot open does not stop it, nor the service that calls
// it at start: it seals the others, leaves that one as it is and names its
// key. Get then fails on that key only.
func TestRekeySkipsWhatItCannotOpen(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		plain := db.open(t, nil)
		oldKey, droppedKey, newKey := key32(1), key32(9), key32(2)
		withOld, err := db.New(t.Context(), &catalog.Options{Sealer: sealer(t, oldKey)})
		require.NoError(t, err)
		// It seals with the key dropped later; holding the old one too, it
		// may seal into a catalog of secrets the old key sealed.
		withDropped, err := db.New(t.Context(), &catalog.Options{Sealer: sealer(t, droppedKey, oldKey)})
		require.NoError(t, err)
		put(t, plain, testKey("a-plain"))
		put(t, withOld, testKey("b-old"))
		put(t, withDropped, testKey("c-dropped"))
		put(t, withOld, testKey("d-tampered"))
		looksSealed := testKey("e-looks-sealed")
		looksSealed.Secret = "v1:not-a-sealed-secret"
		put(t, plain, looksSealed)
		put(t, withOld, testKey("f-old"))
		_, err = db.ExecContext(t.Context(), `UPDATE catalog_keys SET secret = (SELECT secret FROM catalog_keys WHERE id = 'b-old') WHERE id = 'd-tampered'`)
		require.NoError(t, err)

		rotated, err := db.New(t.Context(), &catalog.Options{Sealer: sealer(t, newKey, oldKey)})
		require.NoError(t, err)
		n, skipped, err := rotated.Rekey(t.Context())
		require.NoError(t, err)
		require.Equal(t, 3, n, "the plaintext one and the two sealed with the old key")
		require.Equal(t, []string{"c-dropped", "d-tampered", "e-looks-sealed"}, skipped)

		onlyNew, err := db.New(t.Context(), &catalog.Options{Sealer: sealer(t, newKey)})
		require.NoError(t, err)
		for _, id := range []string{"a-plain", "b-old", "f-old"} {
			require.Equal(t, secret, get(t, onlyNew, id).Secret.Reveal(), id)
		}
		for _, id := range skipped {
			_, err := onlyNew.Get(t.Context(), id)
			require.ErrorIs(t, err, optimistic.ErrStore, id)
		}
		require.Equal(t, secret, get(t, withDropped, "c-dropped").Secret.Reveal(), "left as it was")

		n, again, err := onlyNew.Rekey(t.Context())
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, skipped, again)
	})
}

// A Sealer none of whose keys sealed any of the catalog's secrets is the
// wrong one: Rekey refuses it and writes nothing (it would seal the
// plaintext ones with it). An empty catalog has nothing to check; given
// the right key as old, the wrong one reseals.
func TestRekeyRefusesAWrongKey(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		plain := db.open(t, nil)
		right, wrong := key32(1), key32(2)
		withWrong := db.open(t, &catalog.Options{Sealer: sealer(t, wrong)})
		n, skipped, err := withWrong.Rekey(t.Context())
		require.NoError(t, err, "an empty catalog")
		require.Zero(t, n)
		require.Empty(t, skipped)

		withRight := db.open(t, &catalog.Options{Sealer: sealer(t, right)})
		put(t, plain, testKey("a-plain"))
		put(t, withRight, testKey("b-sealed"))
		put(t, withRight, testKey("c-sealed"))
		n, skipped, err = withWrong.Rekey(t.Context())
		require.ErrorIs(t, err, catalog.ErrWrongKey)
		require.NotContains(t, err.Error(), secret)
		require.Zero(t, n)
		require.Empty(t, skipped)
		var stored string
		require.NoError(t, db.QueryRowContext(t.Context(), `SELECT secret FROM catalog_keys WHERE id = 'a-plain'`).Scan(&stored))
		require.Equal(t, secret, stored, "the plaintext one left for the right key to seal")
		for _, id := range []string{"a-plain", "b-sealed", "c-sealed"} {
			require.Equal(t, secret, get(t, withRight, id).Secret.Reveal(), id)
		}

		rotating := db.open(t, &catalog.Options{Sealer: sealer(t, wrong, right)})
		n, skipped, err = rotating.Rekey(t.Context())
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Empty(t, skipped)
		n, _, err = withWrong.Rekey(t.Context())
		require.NoError(t, err, "now its key sealed them")
		require.Zero(t, n)
	})
}

// An instance given the wrong key seals nothing into a catalog whose
// sealed secrets none of its keys sealed: it would add secrets the others
// cannot open, and then pass its own start's check. Into an empty or
// plaintext-only catalog it may (nothing tells which key is right).
func TestPutRefusesAWrongKey(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		plain := db.open(t, nil)
		right, wrong := key32(1), key32(2)
		withWrong := db.open(t, &catalog.Options{Sealer: sealer(t, wrong)})
		withRight := db.open(t, &catalog.Options{Sealer: sealer(t, right)})
		put(t, plain, testKey("a-plain"))
		put(t, withRight, testKey("b-sealed"))

		_, err := withWrong.PutMany(t.Context(), testKey("c"), testKey("d"))
		require.ErrorIs(t, err, catalog.ErrWrongKey)
		require.NotContains(t, err.Error(), secret)
		_, err = withWrong.Put(t.Context(), testKey("b-sealed"))
		require.ErrorIs(t, err, catalog.ErrWrongKey, "not even over the only sealed one")
		keys, err := plain.List(t.Context(), "", "")
		require.NoError(t, err)
		require.Len(t, keys, 2, "nothing written")
		require.Equal(t, secret, get(t, withRight, "b-sealed").Secret.Reveal())

		rotating := db.open(t, &catalog.Options{Sealer: sealer(t, wrong, right)})
		put(t, rotating, testKey("c"))
		put(t, withWrong, testKey("d"))
		require.NoError(t, plain.Delete(t.Context(), "b-sealed"))
		require.NoError(t, plain.Delete(t.Context(), "c"))
		require.NoError(t, plain.Delete(t.Context(), "d"))
		put(t, withRight, testKey("e"))
	})
}

// A sealed secret is bound to its key: moved to another row, it does not
// open.
func TestSealedSecretBoundToItsKey(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		sealed, err := db.New(t.Context(), &catalog.Options{Sealer: sealer(t, key32(3))})
		require.NoError(t, err)
		put(t, sealed, testKey("a"))
		put(t, c, testKey("b"))
		_, err = db.ExecContext(t.Context(), `UPDATE catalog_keys SET secret = (SELECT secret FROM catalog_keys WHERE id = 'a') WHERE id = 'b'`)
		require.NoError(t, err)
		_, err = sealed.Get(t.Context(), "b")
		require.ErrorIs(t, err, optimistic.ErrStore)
	})
}

func TestParseSealer(t *testing.T) {
	k1, err := catalog.NewSealerKey()
	require.NoError(t, err)
	k2, err := catalog.NewSealerKey()
	require.NoError(t, err)
	_, err = catalog.ParseSealer(k1, k2+", ")
	require.NoError(t, err)
	for _, bad := range [][2]string{{"", ""}, {"not base64!", ""}, {"c2hvcnQ=", ""}, {k1, "bad!"}} {
		_, err := catalog.ParseSealer(bad[0], bad[1])
		require.Error(t, err, "%q", bad)
		require.NotContains(t, err.Error(), k1)
	}
}
