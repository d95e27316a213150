package sink

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// postgresDSNEnv names the environment variable with the test server's DSN.
const postgresDSNEnv = "DEDUPE_TEST_POSTGRES_DSN"

// testPool connects to the server named by DEDUPE_TEST_POSTGRES_DSN, or
// skips the test when it is unset. A set but unreachable server fails the
// test.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := os.Getenv(postgresDSNEnv)
	if dsn == "" {
		t.Skip(postgresDSNEnv + " unset: no PostgreSQL server to test against (start one with sink/testdata/start-postgres.sh)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("%s: %v", postgresDSNEnv, err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to %s: %v", postgresDSNEnv, err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("ping the server in %s: %v", postgresDSNEnv, err)
	}
	return pool
}

// newTable returns a unique table name, dropped when the test ends.
func newTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	table := fmt.Sprintf("sink_test_%d_%d", time.Now().UnixNano(), bucketSeq.Add(1))
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	return table
}

// postgresSnapshot reads every row of table as a total.
func postgresSnapshot(ctx context.Context, pool *pgxpool.Pool, table string) (map[string]int64, error) {
	id, err := ParseTable(table)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, "SELECT group_key, bucket, total FROM "+id.Sanitize())
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var tt Total
	_, err = pgx.ForEachRow(rows, []any{&tt.Group, &tt.Bucket, &tt.Value}, func() error {
		out[tt.ID()] = tt.Value
		return nil
	})
	return out, err
}

// postgresEnv returns a conformance env over a fresh table; every sink gets
// its own pool, as another instance would have.
func postgresEnv(t *testing.T, pool *pgxpool.Pool) env {
	table := newTable(t, pool)
	if err := CreateSchema(context.Background(), pool, table); err != nil {
		t.Fatal(err)
	}
	return env{
		newSink: func(t *testing.T) Sink {
			s, err := NewPostgres(context.Background(), testPool(t), table)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		snapshot: func(ctx context.Context) (map[string]int64, error) {
			return postgresSnapshot(ctx, pool, table)
		},
	}
}

func TestPostgres(t *testing.T) {
	pool := testPool(t)
	runConformance(t, "postgres", func(t *testing.T) env { return postgresEnv(t, pool) })

	t.Run("schema", func(t *testing.T) {
		ctx := context.Background()
		table := newTable(t, pool)
		if _, err := NewPostgres(ctx, pool, table); !errors.Is(err, ErrNoTable) {
			t.Fatalf("NewPostgres before CreateSchema: error = %v, want ErrNoTable", err)
		}
		for i := range 2 {
			if err := CreateSchema(ctx, pool, table); err != nil {
				t.Fatalf("CreateSchema #%d: %v", i+1, err)
			}
		}
		if _, err := NewPostgres(ctx, pool, table); err != nil {
			t.Fatalf("NewPostgres after CreateSchema: %v", err)
		}

		wrong := newTable(t, pool)
		if _, err := pool.Exec(ctx, "CREATE TABLE "+wrong+" (group_key text, n bigint)"); err != nil {
			t.Fatal(err)
		}
		if _, err := NewPostgres(ctx, pool, wrong); !errors.Is(err, ErrNoTable) {
			t.Fatalf("NewPostgres on a table without bucket/total: error = %v, want ErrNoTable", err)
		}
	})

	t.Run("schema-qualified", func(t *testing.T) {
		ctx := context.Background()
		schema := newTable(t, pool) // a unique name, used for a schema
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
		table := schema + ".totals"
		if err := CreateSchema(ctx, pool, table); err != nil {
			t.Fatal(err)
		}
		s, err := NewPostgres(ctx, pool, table)
		if err != nil {
			t.Fatal(err)
		}
		checkedWrite(t, s, []Total{tot("g", bucket0, 4)})
		snap, err := postgresSnapshot(ctx, pool, table)
		if err != nil {
			t.Fatal(err)
		}
		if snap[tot("g", bucket0, 0).ID()] != 4 {
			t.Fatalf("%s holds %v, want g@bucket0 = 4", table, snap)
		}
	})

	t.Run("updated_at only on raise", func(t *testing.T) {
		ctx := context.Background()
		e := postgresEnv(t, pool)
		s := e.newSink(t)
		row := func() (int64, time.Time, time.Time) {
			t.Helper()
			var v int64
			var b, u time.Time
			// One row in this fresh table.
			q := "SELECT total, bucket, updated_at FROM " + tableOf(t, s)
			if err := pool.QueryRow(ctx, q).Scan(&v, &b, &u); err != nil {
				t.Fatal(err)
			}
			return v, b, u
		}
		checkedWrite(t, s, []Total{tot("u", bucket0, 10)})
		v1, b1, u1 := row()
		if v1 != 10 || !b1.Equal(bucket0) {
			t.Fatalf("row = (%d, %v), want (10, %v)", v1, b1, bucket0)
		}
		time.Sleep(10 * time.Millisecond) // on purpose: now() moves on, so a newer write's updated_at is later
		checkedWrite(t, s, []Total{tot("u", bucket0, 9)})
		if v, _, u := row(); v != 10 || !u.Equal(u1) {
			t.Fatalf("after a stale write row = (%d, updated %v), want (10, updated %v)", v, u, u1)
		}
		checkedWrite(t, s, []Total{tot("u", bucket0, 11)})
		if v, _, u := row(); v != 11 || !u.After(u1) {
			t.Fatalf("after a raise row = (%d, updated %v), want (11, updated after %v)", v, u, u1)
		}
	})
}

// tableOf returns the quoted name of the table a postgres sink writes to.
func tableOf(t *testing.T, s Sink) string {
	t.Helper()
	ps, ok := s.(*postgresSink)
	if !ok {
		t.Fatalf("%T is not the postgres sink", s)
	}
	return ps.table
}

func TestParseTable(t *testing.T) {
	long := strings.Repeat("a", 63)
	tests := []struct {
		table string
		want  string // sanitized, "" for an error
	}{
		{"totals", `"totals"`},
		{"_t1", `"_t1"`},
		{"analytics.totals", `"analytics"."totals"`},
		{long, `"` + long + `"`},
		{long + "a", ""},
		{"", ""},
		{"Totals", ""},
		{"1totals", ""},
		{"to-tals", ""},
		{"to tals", ""},
		{`"totals"`, ""},
		{"totals;drop table x", ""},
		{"a.b.c", ""},
		{".totals", ""},
		{"totals.", ""},
		{"tötals", ""},
	}
	for _, tc := range tests {
		t.Run(tc.table, func(t *testing.T) {
			id, err := ParseTable(tc.table)
			if tc.want == "" {
				if !errors.Is(err, ErrBadTable) {
					t.Fatalf("ParseTable(%q) = %v, %v; want ErrBadTable", tc.table, id, err)
				}
				// The constructors refuse it before touching the pool.
				if err := CreateSchema(context.Background(), nil, tc.table); !errors.Is(err, ErrBadTable) {
					t.Fatalf("CreateSchema(%q) = %v, want ErrBadTable", tc.table, err)
				}
				if _, err := NewPostgres(context.Background(), nil, tc.table); !errors.Is(err, ErrBadTable) {
					t.Fatalf("NewPostgres(%q) = %v, want ErrBadTable", tc.table, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseTable(%q): %v", tc.table, err)
			}
			if got := id.Sanitize(); got != tc.want {
				t.Fatalf("ParseTable(%q).Sanitize() = %s, want %s", tc.table, got, tc.want)
			}
		})
	}
}
