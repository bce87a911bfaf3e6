package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/credpool/credpool/internal/pgproc"
)

// startPostgres starts a throwaway PostgreSQL server on loopback for the
// service's catalogs and returns it with its version. The caller must
// Stop it; on failure nothing is left running.
func startPostgres(ctx context.Context) (*pgproc.Server, string, error) {
	pg, err := pgproc.Run()
	if err != nil {
		return nil, "", fmt.Errorf("bench: PostgreSQL for the catalog: %w", err)
	}
	version, err := postgresVersion(ctx, pg.URL("postgres"))
	if err != nil {
		pg.Stop()
		return nil, "", err
	}
	return pg, version, nil
}

// postgresVersion is the server's version, e.g. "15.14 (Debian …)".
func postgresVersion(ctx context.Context, url string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", fmt.Errorf("bench: PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "", fmt.Errorf("bench: PostgreSQL version: %w", err)
	}
	return v, nil
}

// newCatalogDB creates a fresh database on pg named name and returns its
// URL. The database lives as long as the server.
func newCatalogDB(ctx context.Context, pg *pgproc.Server, name string) (string, error) {
	if err := pg.CreateDB(ctx, name); err != nil {
		return "", fmt.Errorf("bench: create the catalog database %s: %w", name, err)
	}
	return pg.URL(name), nil
}
