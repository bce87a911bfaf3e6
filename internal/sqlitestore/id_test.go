package sqlitestore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/sqlitestore"
)

// The file keeps the store's id: the first EnsureID writes it, every
// later one (from another Store on the file too) reads it back; another
// file is another store; a file that lost its row takes the id offered.
func TestEnsureIDIsWrittenOnce(t *testing.T) {
	ctx := t.Context()
	s, db := newStore(t)
	id, wrote, err := s.EnsureID(ctx, "one")
	require.NoError(t, err)
	require.Equal(t, "one", id)
	require.True(t, wrote)
	id, wrote, err = s.EnsureID(ctx, "two")
	require.NoError(t, err)
	require.Equal(t, "one", id)
	require.False(t, wrote)

	same, err := sqlitestore.New(ctx, db, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = same.Close() })
	id, _, err = same.EnsureID(ctx, "three")
	require.NoError(t, err)
	require.Equal(t, "one", id, "another process on the file")

	other, _ := newStore(t)
	id, _, err = other.EnsureID(ctx, "four")
	require.NoError(t, err)
	require.Equal(t, "four", id, "another file")

	_, err = db.ExecContext(ctx, `DELETE FROM lease_meta`)
	require.NoError(t, err)
	id, wrote, err = s.EnsureID(ctx, "five")
	require.NoError(t, err)
	require.Equal(t, "five", id)
	require.True(t, wrote)
}
