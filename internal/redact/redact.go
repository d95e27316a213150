// Package redact keeps credentials out of everything the stage prints: log
// lines, error messages and check-config's summary.
//
// It works in two layers. Display forms (NATSURL, DSN) render a NATS URL
// list or a PostgreSQL connection string from what the URL and pgx parsers
// read, with every credential replaced by Mask; they are what the stage
// prints where it names its targets. A Redactor then replaces every known
// secret (and every raw URL or DSN, by its display form) in any text, so that
// an error from a library that echoes a connection string, or a URL in a log
// attribute, is covered too:
//
//	r := redact.New(redact.NATSURLSecrets(url), redact.DSNSecrets(dsn), redact.Plain(password))
//	log := slog.New(r.Handler(slog.NewJSONHandler(os.Stderr, nil)))
//	fmt.Println(r.String(err.Error()))
//
// What a parser cannot read is redacted conservatively: a URL that does not
// parse is masked whole, and so is a connection string that pgx refuses
// (with the values of its password keywords masked on their own as well).
package redact

import (
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nkeys"
)

// Mask replaces a secret in printed text.
const Mask = "xxxxx"

// MinSecretLen is the shortest secret a Redactor replaces inside arbitrary
// text. A shorter one (a password such as "a") would turn every occurrence
// of that letter in every log line into Mask; it is still never printed by
// the display forms, which mask credentials by position.
const MinSecretLen = 4

// Secrets is a set of replacements: each Old in printed text becomes New.
type Secrets []Replacement

// Replacement is one secret and what is printed in its place.
type Replacement struct {
	// Old is the text to hide: a secret, or a whole raw URL or DSN.
	Old string
	// New is what is printed instead: Mask, or a display form.
	New string
}

// Plain returns the secrets given as they are (a password, a token), each
// replaced by Mask. Empty strings are skipped.
func Plain(secrets ...string) Secrets {
	var out Secrets
	for _, s := range secrets {
		if s != "" {
			out = append(out, Replacement{Old: s, New: Mask})
		}
	}
	return out
}

// NKeySeed returns v as a secret when it parses as an NKey seed (someone
// wrote the seed itself where a seed file's path belongs), else nothing.
func NKeySeed(v string) Secrets {
	v = strings.TrimSpace(v)
	if _, err := nkeys.FromSeed([]byte(v)); err != nil {
		return nil
	}
	return Plain(v)
}

// natsURLs splits a nats.url value the way nats.go does: on commas, each
// element trimmed.
func natsURLs(raw string) []string {
	parts := strings.Split(raw, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// parseNATSURL parses one server URL as nats.go does (a missing scheme is
// nats://). It returns nil when the URL does not parse or names no host.
func parseNATSURL(s string) *url.URL {
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return nil
	}
	return u
}

// NATSURL returns the display form of a nats.url value, one URL or a
// comma-separated list. In each URL the user information is masked: a
// password (user:xxxxx@), or a user name alone, which NATS reads as a token
// (xxxxx@); so are query values and fragments. An element that does not
// parse as a URL with a host is printed as Mask.
func NATSURL(raw string) string {
	if raw == "" {
		return ""
	}
	parts := natsURLs(raw)
	out := make([]string, len(parts))
	for i, p := range parts {
		if p == "" {
			continue
		}
		u := parseNATSURL(p)
		if u == nil {
			out[i] = Mask
			continue
		}
		out[i] = displayURL(u).String()
	}
	return strings.Join(out, ",")
}

// displayURL returns u with credentials masked.
func displayURL(u *url.URL) *url.URL {
	d := *u
	if d.User != nil {
		if _, ok := d.User.Password(); ok {
			d.User = url.UserPassword(d.User.Username(), Mask)
		} else {
			d.User = url.User(Mask)
		}
	}
	if d.RawQuery != "" {
		q := d.Query()
		for k := range q {
			q[k] = []string{Mask}
		}
		d.RawQuery = q.Encode()
	}
	if d.Fragment != "" {
		d.Fragment, d.RawFragment = Mask, ""
	}
	return &d
}

// NATSURLSecrets returns what NATSURL hides in a nats.url value, for a
// Redactor: each element that carries credentials (or does not parse) as a
// whole, replaced by its display form, and the password or token itself,
// raw and escaped as it may appear in a URL.
func NATSURLSecrets(raw string) Secrets {
	var out Secrets
	for _, p := range natsURLs(raw) {
		if p == "" {
			continue
		}
		u := parseNATSURL(p)
		if u == nil {
			out = append(out, Replacement{Old: p, New: Mask})
			continue
		}
		d := displayURL(u).String()
		if d != p {
			out = append(out, Replacement{Old: p, New: d})
		}
		if u.User != nil {
			secret, ok := u.User.Password()
			if !ok {
				secret = u.User.Username()
			}
			out = append(out, escapedForms(secret)...)
		}
		if u.RawQuery != "" {
			for _, vs := range u.Query() {
				out = append(out, escapedForms(vs...)...)
			}
		}
	}
	return out
}

// escapedForms returns each secret as it is and as URL escaping may have
// written it, each replaced by Mask.
func escapedForms(secrets ...string) Secrets {
	var out Secrets
	for _, s := range secrets {
		// Userinfo.String is ":<password as the userinfo escapes it>".
		out = append(out, Plain(s, url.QueryEscape(s), url.PathEscape(s), url.UserPassword("", s).String()[1:])...)
	}
	return out
}

// DSN returns the display form of a PostgreSQL connection string (URL or
// keyword/value form), rendered from what pgx's parser read:
// postgres://user:xxxxx@host:port/database, with every fallback host, and
// the password shown as Mask when one is set. A string pgx refuses is printed
// as Mask with a note that it does not parse.
func DSN(raw string) string {
	if raw == "" {
		return ""
	}
	cfg, err := pgconn.ParseConfig(raw)
	if err != nil {
		return Mask + " (does not parse as a PostgreSQL connection string)"
	}
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		// pgx splits a URL's user information at the first '@', net/url at
		// the last: where they disagree, part of what was meant as the
		// password would be printed as the host.
		if pw, _ := u.User.Password(); pw != cfg.Password && !u.Query().Has("password") {
			return Mask + " (the URL's user information is ambiguous: escape '@' in the password as %40)"
		}
	}
	hosts := []string{hostPort(cfg.Host, cfg.Port)}
	for _, fb := range cfg.Fallbacks {
		if hp := hostPort(fb.Host, fb.Port); !slices.Contains(hosts, hp) {
			hosts = append(hosts, hp)
		}
	}
	user := url.User(cfg.User)
	if cfg.Password != "" {
		user = url.UserPassword(cfg.User, Mask)
	}
	u := url.URL{Scheme: "postgres", User: user, Host: strings.Join(hosts, ","), Path: "/" + cfg.Database}
	return u.String()
}

func hostPort(host string, port uint16) string {
	if strings.HasPrefix(host, "/") {
		return url.PathEscape(host) // a Unix socket directory
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(int(port))
}

// DSNSecrets returns what DSN hides in a PostgreSQL connection string, for a
// Redactor: the whole string (replaced by its display form) and the password
// pgx reads from it, raw, escaped as a URL may write it and quoted as the
// keyword/value form may write it. When pgx refuses the string, the whole
// string is masked, and so is every value written after a password= or
// sslpassword= keyword, or after the user information of a URL
// (conservatively, up to the last '@').
func DSNSecrets(raw string) Secrets {
	if raw == "" {
		return nil
	}
	out := Secrets{{Old: raw, New: DSN(raw)}}
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			out = append(out, escapedForms(pw)...)
		}
	}
	if u, err := url.Parse(raw); err == nil && u.RawQuery != "" {
		for k, vs := range u.Query() {
			if strings.Contains(strings.ToLower(k), "password") {
				out = append(out, escapedForms(vs...)...)
			}
		}
	}
	cfg, err := pgconn.ParseConfig(raw)
	if err == nil {
		return append(out, quotedForms(cfg.Password)...)
	}
	out = append(out, unparsedDSNSecrets(raw)...)
	return out
}

// quotedForms returns a keyword/value password as it is, escaped inside
// single quotes, and URL-escaped.
func quotedForms(pw string) Secrets {
	if pw == "" {
		return nil
	}
	q := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw)
	return append(Plain(q, "'"+q+"'"), escapedForms(pw)...)
}

// unparsedDSNSecrets is the conservative fallback for a connection string
// pgx refuses: a URL's user info and every password keyword's value.
func unparsedDSNSecrets(raw string) Secrets {
	var out Secrets
	if i := strings.Index(raw, "://"); i >= 0 {
		if at := strings.LastIndex(raw, "@"); at > i+3 {
			out = append(out, Plain(raw[i+3:at])...)
		}
	}
	lower := strings.ToLower(raw)
	for _, kw := range []string{"password", "sslpassword"} {
		for start := 0; ; {
			j := strings.Index(lower[start:], kw)
			if j < 0 {
				break
			}
			start += j + len(kw)
			rest := strings.TrimLeft(raw[start:], " \t")
			if !strings.HasPrefix(rest, "=") {
				continue
			}
			out = append(out, keywordValue(strings.TrimLeft(rest[1:], " \t"))...)
		}
	}
	return out
}

// keywordValue returns the forms of the value at the start of rest, which
// follows a keyword's '='. A quoted value, possibly unterminated, runs to
// its closing quote or the end; a bare one to a space or '&'.
func keywordValue(rest string) Secrets {
	if !strings.HasPrefix(rest, "'") {
		if end := strings.IndexAny(rest, " \t\n&"); end >= 0 {
			rest = rest[:end]
		}
		return Plain(rest)
	}
	end := len(rest)
	for k := 1; k < len(rest); k++ {
		if rest[k] == '\\' {
			k++
			continue
		}
		if rest[k] == '\'' {
			end = k + 1
			break
		}
	}
	return Plain(rest[:end], strings.Trim(rest[:end], "'"))
}
