package layout

import (
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/dedupe-stage/dedupe-stage/keys"
)

// keyed is the partitioning of input "orders.*" by its second token into
// 4 partitions, with scale_out.route auto.
func keyed() Partitioning {
	return Partitioning{Subjects: []string{"orders.*"}, Field: keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 2},
		FieldName: "key", Partitions: 4, Route: RouteAuto}
}

// TestTransformPartitionsTheKey checks the derived transform on a real
// server's subject transform: the stored subject is the partition token,
// FNV-1a-32 of the key token mod N, then the subject unchanged.
func TestTransformPartitionsTheKey(t *testing.T) {
	pt := keyed()
	pt.Subjects = []string{"shop.*.orders.*.>"}
	pt.Field.SubjectToken = 4
	src, dest, err := pt.Transform()
	if err != nil {
		t.Fatal(err)
	}
	if want := "{{partition(4,2)}}.shop.{{wildcard(1)}}.orders.{{wildcard(2)}}.>"; src != "shop.*.orders.*.>" || dest != want {
		t.Fatalf("transform %q -> %q, want shop.*.orders.*.> -> %q", src, dest, want)
	}
	tr, err := server.NewSubjectTransform(src, dest)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"o-1", "o-2", "o-3", "x", "a-much-longer-order-id"} {
		subj := "shop.eu." + "orders." + key + ".created.v1"
		got, err := tr.Match(subj)
		if err != nil {
			t.Fatalf("transform %s: %v", subj, err)
		}
		p := fnv1a32([]byte(key)) % 4
		if want := string(rune('0'+p)) + "." + subj; got != want {
			t.Errorf("%s -> %s, want %s", subj, got, want)
		}
	}
}

// fnv1a32 is FNV-1a 32-bit, written out here so that the test does not
// trust the code it checks.
func fnv1a32(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	return h
}

func TestTransformRefusals(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Partitioning)
		want   string
	}{
		{"two subjects", func(pt *Partitioning) { pt.Subjects = []string{"a.*", "b.*"} }, "input.subjects has 2 subjects"},
		{"header key", func(pt *Partitioning) { pt.Field = keys.FieldSpec{Source: keys.SourceHeader, Header: "Nats-Msg-Id"} }, "key is header"},
		{"literal token", func(pt *Partitioning) { pt.Field.SubjectToken = 1 }, "key.subject_token 1 is not a '*' token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pt := keyed()
			tt.change(&pt)
			if _, _, err := pt.Transform(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Transform error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestRouted(t *testing.T) {
	pt := keyed()
	if routed, why := pt.Routed(); routed {
		t.Errorf("subject key, route auto: routed (%s); want the server's transform", why)
	}
	pt.Route = RouteAlways
	if routed, _ := pt.Routed(); !routed {
		t.Error("route always: not routed")
	}
	pt.Route = RouteAuto
	pt.Field = keys.FieldSpec{Source: keys.SourceHeader, Header: "Nats-Msg-Id"}
	if routed, why := pt.Routed(); !routed || !strings.Contains(why, "key is header") {
		t.Errorf("header key, route auto: routed %v (%s); want routed, saying why", routed, why)
	}
	pt.Route = RouteNever
	if routed, _ := pt.Routed(); routed {
		t.Error("route never: routed")
	}
}

func TestNames(t *testing.T) {
	bucket, every, ttl := Presence("g", 0)
	for _, c := range []struct{ got, want string }{
		{Member(3), "p3"},
		{MemberConsumer("g", 3), "g-p3"},
		{SnapshotBucket("g"), "g-snapshots"},
		{SnapshotObject(3), "p3"},
		{HandOverBucket("g"), "g-handovers"},
		{bucket, "g-members"},
		{every.String() + " " + ttl.String(), "1s 3s"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
