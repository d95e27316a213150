package redact

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nkeys"
)

// leaks returns the secrets that appear in s.
func leaks(s string, secrets ...string) []string {
	var out []string
	for _, sec := range secrets {
		if strings.Contains(s, sec) {
			out = append(out, sec)
		}
	}
	return out
}

func TestNATSURL(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    string
		secrets []string // must not appear in any printed form
	}{
		{"user and password", "nats://app:s3cret-pass@127.0.0.1:4222", "nats://app:xxxxx@127.0.0.1:4222", []string{"s3cret-pass"}},
		{"token as user", "nats://t0ken-value@127.0.0.1:4222", "nats://xxxxx@127.0.0.1:4222", []string{"t0ken-value"}},
		{"no credentials", "nats://127.0.0.1:4222", "nats://127.0.0.1:4222", nil},
		{"list", "nats://a:pw1-secret@h1:4222, tls://h2:4222,nats://tok2-secret@h3", "nats://a:xxxxx@h1:4222,tls://h2:4222,nats://xxxxx@h3", []string{"pw1-secret", "tok2-secret"}},
		{"no scheme", "app:pw-noscheme@h1:4222", "nats://app:xxxxx@h1:4222", []string{"pw-noscheme"}},
		{"escaped password", "nats://app:p%40ss%20w0rd@host:4222", "nats://app:xxxxx@host:4222", []string{"p@ss w0rd", "p%40ss%20w0rd"}},
		{"query and fragment", "ws://host:8080/path?auth_token=q-secret-1#frag-secret", "ws://host:8080/path?auth_token=xxxxx#xxxxx", []string{"q-secret-1", "frag-secret"}},
		{"does not parse", "nats://us er:unparsed-pw@ho st:4222", "xxxxx", []string{"unparsed-pw"}},
		{"bad port", "nats://app:portpw-secret@host:notaport", "xxxxx", []string{"portpw-secret"}},
		{"comma in the password", "nats://app:se,cret-comma@h:4222", "xxxxx,nats://xxxxx@h:4222", []string{"se,cret-comma", "cret-comma"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := NATSURL(tt.raw)
			if got != tt.want {
				t.Errorf("NATSURL(%q) = %q, want %q", tt.raw, got, tt.want)
			}
			r := New(NATSURLSecrets(tt.raw))
			_, perr := url.Parse(tt.raw) // net/url echoes the URL in its errors
			for _, s := range []string{
				got,
				r.String(tt.raw),
				r.String("connect to nats at " + tt.raw + ": refused"),
				r.String(fmt.Sprint(perr)),
			} {
				if l := leaks(s, tt.secrets...); l != nil {
					t.Errorf("%q shows %q", s, l)
				}
			}
		})
	}
}

func TestDSN(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    string
		secrets []string
	}{
		{"url", "postgres://app:pg-s3cret@db.local:5433/totals?sslmode=disable", "postgres://app:xxxxx@db.local:5433/totals", []string{"pg-s3cret"}},
		{"url, escaped password", "postgresql://app:pg%2Fs%40cret@db/totals?sslmode=disable", "postgres://app:xxxxx@db:5432/totals", []string{"pg/s@cret", "pg%2Fs%40cret"}},
		{"url, password in the query", "postgres://app@db/totals?sslmode=disable&password=pg-query-secret", "postgres://app:xxxxx@db:5432/totals", []string{"pg-query-secret"}},
		{"url, sslpassword", "postgres://app@db/totals?sslmode=disable&sslpassword=ssl-key-secret", "postgres://app@db:5432/totals", []string{"ssl-key-secret"}},
		{"url, no password", "postgres://app@db/totals?sslmode=disable", "postgres://app@db:5432/totals", nil},
		{"fallback hosts", "postgres://app:pg-multi-secret@db1:5432,db2:5433/totals?sslmode=disable", "postgres://app:xxxxx@db1:5432,db2:5433/totals", []string{"pg-multi-secret"}},
		{"keyword/value", "host=db user=app password=pg-kv-secret dbname=totals sslmode=disable", "postgres://app:xxxxx@db:5432/totals", []string{"pg-kv-secret"}},
		{"keyword/value, quoted", `host=db user=app password='pg quoted \' s\\ecret' dbname=totals sslmode=disable`, "postgres://app:xxxxx@db:5432/totals", []string{`pg quoted ' s\ecret`, `pg quoted \' s\\ecret`, "quoted"}},
		{"keyword/value, spaces round =", "host=db user=app password = pg-spaced-secret dbname=totals sslmode=disable", "postgres://app:xxxxx@db:5432/totals", []string{"pg-spaced-secret"}},
		{"keyword/value, unterminated quote", "host=db user=app password='pg-unterminated secret dbname=totals", "xxxxx (does not parse as a PostgreSQL connection string)", []string{"pg-unterminated", "unterminated secret"}},
		{"keyword/value, bad keyword", "host=db password=pg-badkw-secret nonsense", "xxxxx (does not parse as a PostgreSQL connection string)", []string{"pg-badkw-secret"}},
		{"url, bad port", "postgres://app:pg-badport-secret@db:notaport/totals", "xxxxx (does not parse as a PostgreSQL connection string)", []string{"pg-badport-secret"}},
		{"url, at sign in the password", "postgres://app:pg@at-secret@db/totals", "", []string{"pg@at-secret", "at-secret"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DSN(tt.raw)
			if tt.want != "" && got != tt.want {
				t.Errorf("DSN(%q) = %q, want %q", tt.raw, got, tt.want)
			}
			r := New(DSNSecrets(tt.raw))
			_, perr := pgconn.ParseConfig(tt.raw) // pgx's error echoes the string, best-effort redacted
			for _, s := range []string{
				got,
				r.String(tt.raw),
				r.String("sink: " + tt.raw + ": failed"),
				r.String(fmt.Sprint(perr)),
				r.Error(fmt.Errorf("totals.sinks.postgres.dsn: %w", perr)).Error(),
			} {
				if l := leaks(s, tt.secrets...); l != nil {
					t.Errorf("%q shows %q", s, l)
				}
			}
		})
	}
}

func TestNKeySeed(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	r := New(NKeySeed(string(seed)), NKeySeed("/etc/nats/user.nk"))
	if got := r.String("nats.nkey_seed_file " + string(seed) + ": no such file"); strings.Contains(got, string(seed)) {
		t.Errorf("seed printed: %s", got)
	}
	if got := r.String("/etc/nats/user.nk"); got != "/etc/nats/user.nk" {
		t.Errorf("a seed file's path was redacted: %s", got)
	}
}

func TestRedactorShortSecretsAndOrder(t *testing.T) {
	r := New(Plain("abc", "longer-secret"), Secrets{{Old: "nats://u:longer-secret@h", New: "nats://u:xxxxx@h"}})
	if got := r.String("abc nats://u:longer-secret@h longer-secret"); got != "abc nats://u:xxxxx@h xxxxx" {
		t.Errorf("got %q", got)
	}
	var nilR *Redactor
	if nilR.String("x") != "x" || New().String("x") != "x" {
		t.Error("an empty Redactor changed text")
	}
}

func TestRedactorError(t *testing.T) {
	r := New(Plain("hunter22"))
	base := &fs.PathError{Op: "open", Path: "/x/hunter22", Err: fs.ErrNotExist}
	err := r.Error(fmt.Errorf("load: %w", base))
	if strings.Contains(err.Error(), "hunter22") {
		t.Errorf("error shows the secret: %v", err)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("redacted error lost its chain: %v", err)
	}
	clean := errors.New("nothing secret")
	if r.Error(clean) != clean || r.Error(nil) != nil {
		t.Error("an error without secrets was rewrapped")
	}
}

type stringer struct{ s string }

func (s stringer) String() string { return s.s }

func TestHandler(t *testing.T) {
	secret := "tok-9f8e7d"
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			var h slog.Handler = slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})
			if format == "json" {
				h = slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})
			}
			log := slog.New(New(Plain(secret)).Handler(h))
			log.Info("connecting to nats://"+secret+"@h", "url", "nats://"+secret+"@h", "n", 3)
			log.With("conn", "nats://"+secret+"@h").Warn("x", "err", errors.New("refused "+secret))
			log.WithGroup("g").Error("y", slog.Group("inner", "s", stringer{secret}, "any", []string{secret}), "ok", []int{1, 2})
			if strings.Contains(buf.String(), secret) {
				t.Errorf("log shows the secret:\n%s", buf.String())
			}
			if !strings.Contains(buf.String(), "xxxxx") || !strings.Contains(buf.String(), "n=3") && !strings.Contains(buf.String(), `"n":3`) {
				t.Errorf("log lost content:\n%s", buf.String())
			}
			if format == "json" && !strings.Contains(buf.String(), `"ok":[1,2]`) {
				t.Errorf("a value without secrets lost its structure:\n%s", buf.String())
			}
		})
	}
}
