package sink

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MaxPostgresAttempts bounds how often the PostgreSQL sink runs a batch's
// statement when it fails with a deadlock (40P01) or a serialization failure
// (40001) before it gives up with ErrConflicts.
const MaxPostgresAttempts = 10

// identRe is one lower-case, unquoted-safe PostgreSQL identifier.
var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// postgresSink is the PostgreSQL sink; see NewPostgres.
type postgresSink struct {
	pool   *pgxpool.Pool
	table  string // quoted
	upsert string
	closed atomic.Bool
}

// ParseTable checks a table name for the PostgreSQL sink and returns it as a
// pgx.Identifier. A name is one identifier, or a schema and a table joined by
// ".", each matching [a-z_][a-z0-9_]{0,62}. Upper case is refused because the
// name is always quoted (so it is never folded): "totals" and
// "analytics.totals" are valid, "Totals", "a-b", "x;drop" and "a.b.c" are
// not. Errors wrap ErrBadTable and name the table.
func ParseTable(table string) (pgx.Identifier, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: %q has more than one \".\"", ErrBadTable, table)
	}
	for _, p := range parts {
		if !identRe.MatchString(p) {
			return nil, fmt.Errorf("%w: %q: %q does not match %s", ErrBadTable, table, p, identRe)
		}
	}
	return pgx.Identifier(parts), nil
}

// CreateSchema creates the sink's table if it does not exist (see the package
// comment for its definition). It never alters an existing table. The sink
// never calls it by itself: schema changes happen on request only.
func CreateSchema(ctx context.Context, pool *pgxpool.Pool, table string) error {
	id, err := ParseTable(table)
	if err != nil {
		return err
	}
	ddl := `CREATE TABLE IF NOT EXISTS ` + id.Sanitize() + ` (
	group_key  text        NOT NULL,
	bucket     timestamptz NOT NULL,
	total      bigint      NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (group_key, bucket))`
	if _, err := pool.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("sink postgres: create table %s: %w", table, err)
	}
	return nil
}

// NewPostgres returns a Sink that keeps totals in table, upserting each batch
// with GREATEST in one statement that applies all of it or nothing
// (docs/sinks.md). The table, checked by ParseTable and always quoted, must
// have CreateSchema's columns, or the error wraps ErrNoTable. The sink does
// not own pool; it is safe for concurrent use.
func NewPostgres(ctx context.Context, pool *pgxpool.Pool, table string) (Sink, error) {
	id, err := ParseTable(table)
	if err != nil {
		return nil, err
	}
	q := id.Sanitize()
	probe := `SELECT group_key, bucket, total, updated_at FROM ` + q + ` LIMIT 0`
	rows, err := pool.Query(ctx, probe)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "3F000") {
			return nil, fmt.Errorf("%w: %s: %w", ErrNoTable, table, err)
		}
		return nil, fmt.Errorf("sink postgres: probe table %s: %w", table, err)
	}
	upsert := `WITH up AS (
	INSERT INTO ` + q + ` AS cur (group_key, bucket, total)
	SELECT g, b, v FROM unnest($1::text[], $2::timestamptz[], $3::bigint[]) AS u(g, b, v)
	ORDER BY g, b
	ON CONFLICT (group_key, bucket) DO UPDATE
		SET total = GREATEST(cur.total, EXCLUDED.total), updated_at = now()
		WHERE cur.total < EXCLUDED.total
	RETURNING 1)
SELECT count(*) FROM up`
	return &postgresSink{pool: pool, table: q, upsert: upsert}, nil
}

// Name returns "postgres".
func (s *postgresSink) Name() string { return "postgres" }

// Close marks the sink closed. It is safe to call more than once.
func (s *postgresSink) Close() error {
	s.closed.Store(true)
	return nil
}

// Write upserts the batch in one statement; see NewPostgres.
func (s *postgresSink) Write(ctx context.Context, totals []Total) (Result, error) {
	if s.closed.Load() {
		return Result{}, ErrClosed
	}
	uniq, dropped, err := prepare(totals)
	if err != nil {
		return Result{}, err
	}
	if len(uniq) == 0 {
		return Result{}, nil
	}
	groups := make([]string, len(uniq))
	buckets := make([]time.Time, len(uniq))
	values := make([]int64, len(uniq))
	for i, t := range uniq {
		groups[i], buckets[i], values[i] = t.Group, t.Bucket, t.Value
	}
	var res Result
	for attempt := 1; ; attempt++ {
		var applied int64
		err := s.pool.QueryRow(ctx, s.upsert, groups, buckets, values).Scan(&applied)
		if err == nil {
			res.Applied = int(applied)
			res.Stale = len(uniq) - int(applied) + dropped
			return res, nil
		}
		var pgErr *pgconn.PgError
		retry := errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
		if !retry {
			return res, fmt.Errorf("sink postgres: upsert %d totals into %s: %w", len(uniq), s.table, err)
		}
		if attempt >= MaxPostgresAttempts {
			return res, fmt.Errorf("%w: postgres upsert of %d totals into %s: %d attempts: %w", ErrConflicts, len(uniq), s.table, attempt, err)
		}
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("sink postgres: upsert %d totals into %s: %w", len(uniq), s.table, err)
		}
		res.Retried++
	}
}
