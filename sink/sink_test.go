package sink

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
)

// kvKeyRe is the key syntax JetStream KV accepts (nats.go's validKeyRe plus
// its rules on dots).
var kvKeyRe = regexp.MustCompile(`^[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*$`)

// subjectTokenRe is a conservative NATS subject token.
var subjectTokenRe = regexp.MustCompile(`^[-_=a-zA-Z0-9]+$`)

func TestID(t *testing.T) {
	tests := []struct {
		name  string
		total Total
		want  string
	}{
		{"raw group", tot("campaign-42", bucket0, 1), "campaign-42.1767225600"},
		{"value is not part of the id", tot("campaign-42", bucket0, 99), "campaign-42.1767225600"},
		{"underscore", tot("a_B-9", bucket1, 1), "a_B-9.1767229200"},
		{"zone ignored", Total{Group: "g", Bucket: bucket0.In(time.FixedZone("X", -5*3600))}, "g.1767225600"},
		{"dot and slash", tot("tenant.a/x", bucket0, 1), "=dGVuYW50LmEveA.1767225600"},
		{"equals sign", tot("a=b", bucket0, 1), "=YT1i.1767225600"},
		{"space", tot("a b", bucket0, 1), "=YSBi.1767225600"},
		{"unicode", tot("größe", bucket0, 1), "=Z3LDtsOfZQ.1767225600"},
		{"epoch", tot("g", time.Unix(0, 0), 1), "g.0"},
		{"before 1970", tot("g", time.Unix(-60, 0), 1), "g.-60"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.total.ID()
			if id != tc.want {
				t.Fatalf("ID() = %q, want %q", id, tc.want)
			}
			if !kvKeyRe.MatchString(id) {
				t.Fatalf("ID() = %q is not a valid KV key", id)
			}
			if tok := EncodeGroup(tc.total.Group); !subjectTokenRe.MatchString(tok) {
				t.Fatalf("EncodeGroup(%q) = %q is not a subject token", tc.total.Group, tok)
			}
			g, b, err := ParseID(id)
			if err != nil {
				t.Fatalf("ParseID(%q): %v", id, err)
			}
			if g != tc.total.Group || !b.Equal(tc.total.Bucket) || b.Location() != time.UTC {
				t.Fatalf("ParseID(%q) = %q, %v; want %q, %v in UTC", id, g, b, tc.total.Group, tc.total.Bucket)
			}
		})
	}
}

func TestParseIDRejects(t *testing.T) {
	for _, id := range []string{
		"",
		"campaign-42",                 // no bucket
		"campaign-42.",                // empty bucket
		".1767225600",                 // empty group
		"campaign-42.+1767225600",     // not canonical
		"campaign-42.01767225600",     // not canonical
		"campaign-42.1.5",             // bucket not an integer
		"=Y2FtcGFpZ24tNDI.1767225600", // encoded form of a raw group
		"=!!.1767225600",              // not base64url
		"=.1767225600",                // encodes the empty group
		"=YQ==.1767225600",            // padded
		"=AQ.1767225600",              // control character
		"=_w.1767225600",              // invalid UTF-8
	} {
		_, _, err := ParseID(id)
		if !errors.Is(err, ErrBadID) {
			t.Errorf("ParseID(%q) = %v, want ErrBadID", id, err)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		total Total
		ok    bool
	}{
		{"plain", tot("g", bucket0, 0), true},
		{"longest group", tot(strings.Repeat("x", MaxGroupLen), bucket0, 1), true},
		{"space and unicode", tot("größe tenant", bucket0, 1), true},
		{"empty group", tot("", bucket0, 1), false},
		{"long group", tot(strings.Repeat("x", MaxGroupLen+1), bucket0, 1), false},
		{"newline", tot("a\nb", bucket0, 1), false},
		{"nul", tot("a\x00b", bucket0, 1), false},
		{"invalid utf-8", tot("a\xffb", bucket0, 1), false},
		{"zero bucket", tot("g", time.Time{}, 1), false},
		{"sub-second bucket", tot("g", bucket0.Add(time.Millisecond), 1), false},
		{"negative value", tot("g", bucket0, -1), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := prepare([]Total{tot("ok", bucket0, 1), tc.total})
			if tc.ok && err != nil {
				t.Fatalf("prepare(%+v) = %v, want nil", tc.total, err)
			}
			if !tc.ok && !errors.Is(err, ErrBadTotal) {
				t.Fatalf("prepare(%+v) = %v, want ErrBadTotal", tc.total, err)
			}
			if !tc.ok && !strings.Contains(err.Error(), "totals[1]") {
				t.Fatalf("prepare error %q does not name totals[1]", err)
			}
			if tc.ok && !kvKeyRe.MatchString(tc.total.ID()) {
				t.Fatalf("ID() = %q is not a valid KV key", tc.total.ID())
			}
		})
	}
}

func TestPrepareCollapses(t *testing.T) {
	in := []Total{tot("b", bucket0, 1), tot("a", bucket0, 5), tot("b", bucket0, 7), tot("a", bucket0, 2), tot("b", bucket1, 3)}
	uniq, dropped, err := prepare(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []Total{tot("b", bucket0, 7), tot("a", bucket0, 5), tot("b", bucket1, 3)}
	if dropped != 2 || len(uniq) != len(want) {
		t.Fatalf("prepare = %v, dropped %d; want %v, dropped 2", uniq, dropped, want)
	}
	for i := range want {
		if uniq[i] != want[i] {
			t.Fatalf("prepare[%d] = %+v, want %+v", i, uniq[i], want[i])
		}
	}
}

func TestLatest(t *testing.T) {
	in := []Total{tot("a", bucket0, 5), tot("a", bucket0, 9), tot("a", bucket0, 2), tot("a", bucket1, 1), tot("b", bucket0, 0)}
	got := Latest(in)
	want := map[string]int64{tot("a", bucket0, 0).ID(): 9, tot("a", bucket1, 0).ID(): 1, tot("b", bucket0, 0).ID(): 0}
	if len(got) != len(want) {
		t.Fatalf("Latest = %v, want values %v", got, want)
	}
	for id, v := range want {
		if got[id].Value != v || got[id].ID() != id {
			t.Fatalf("Latest[%s] = %+v, want value %d", id, got[id], v)
		}
	}
	if len(Latest(nil)) != 0 {
		t.Fatal("Latest(nil) is not empty")
	}
}

func TestResultAdd(t *testing.T) {
	got := Result{Applied: 1, Stale: 2, Retried: 3}.Add(Result{Applied: 10, Stale: 20, Retried: 30})
	if want := (Result{Applied: 11, Stale: 22, Retried: 33}); got != want {
		t.Fatalf("Add = %+v, want %+v", got, want)
	}
}

// FuzzID checks that every valid total's ID is a KV key that ParseID
// inverts, and that ParseID accepts only canonical IDs.
func FuzzID(f *testing.F) {
	f.Add("campaign-42", int64(1767225600), "campaign-42.1767225600")
	f.Add("tenant.a/x", int64(0), "=dGVuYW50LmEveA.1767229200")
	f.Add("größe", int64(-60), "=Y2FtcGFpZ24tNDI.1")
	f.Add("", int64(1), "g.01")
	f.Fuzz(func(t *testing.T, group string, secs int64, id string) {
		if len(group) > 2*MaxGroupLen || len(id) > 4*MaxGroupLen {
			return
		}
		total := Total{Group: group, Bucket: time.Unix(secs, 0)}
		if total.validate() == nil {
			tid := total.ID()
			if !kvKeyRe.MatchString(tid) {
				t.Fatalf("ID of %+v = %q is not a valid KV key", total, tid)
			}
			g, b, err := ParseID(tid)
			if err != nil || g != group || b.Unix() != secs {
				t.Fatalf("ParseID(%q) = %q, %v, %v; want %q, %d", tid, g, b, err, group, secs)
			}
		}
		g, b, err := ParseID(id)
		if err != nil {
			if !errors.Is(err, ErrBadID) {
				t.Fatalf("ParseID(%q) error %v is not ErrBadID", id, err)
			}
			return
		}
		if back := (Total{Group: g, Bucket: b}).ID(); back != id {
			t.Fatalf("ParseID(%q) = %q, %v, whose ID is %q", id, g, b, back)
		}
	})
}
