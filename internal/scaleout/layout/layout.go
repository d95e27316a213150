// Package layout names what a scale-out group keeps on the servers: the
// static group's members and their consumers, the buckets of presence,
// hand-overs and snapshots, and the input stream's subject transform that puts
// each key's partition first. It is a leaf: the configuration validates
// with it and every scale-out package names things with it, so that each
// name is made in one place (docs/scale-out.md).
//
//	layout.MemberConsumer("dedupe", 3) // "dedupe-p3"
package layout

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/dedupe-stage/dedupe-stage/keys"
)

// Member returns the name of the static group's member for partition p:
// "p<p>".
func Member(p int) string { return fmt.Sprintf("p%d", p) }

// MemberConsumer returns the name of partition p's consumer in the
// static group: "<group>-p<p>", as pcgroups names a member's consumer.
func MemberConsumer(group string, p int) string { return group + "-" + Member(p) }

// SnapshotBucket returns the Object Store bucket that holds the group's
// partition snapshots: "<group>-snapshots".
func SnapshotBucket(group string) string { return group + "-snapshots" }

// SnapshotObject returns the name of partition p's snapshot in the bucket
// (SnapshotBucket): "p<p>", its member's name; each new snapshot replaces
// the last.
func SnapshotObject(p int) string { return Member(p) }

// HandOverBucket returns the key-value bucket in which each new owner
// records its takeover of a partition (changelog.HandOver, under the
// partition's member name): "<group>-handovers".
func HandOverBucket(group string) string { return group + "-handovers" }

// Presence returns how instances see each other, for balance only
// (docs/scale-out.md §4.2): the KV bucket "<group>-members", how often an
// instance refreshes its key (ackWait, the pin's TTL, at least a
// second), and the key's TTL, three refreshes, after which an instance
// that stopped refreshing is no longer counted.
func Presence(group string, ackWait time.Duration) (bucket string, every, ttl time.Duration) {
	every = max(ackWait, time.Second)
	return group + "-members", every, 3 * every
}

// Values of scale_out.route.
const (
	RouteAuto   = "auto"
	RouteAlways = "always"
	RouteNever  = "never"
)

// Partitioning is what decides how a group's input is partitioned: the
// input stream's subjects, the partition key (Field, read from the
// setting named FieldName), the partition count and scale_out.route.
type Partitioning struct {
	Subjects   []string
	Field      keys.FieldSpec
	FieldName  string
	Partitions int
	Route      string
}

// Transform returns the input stream's subject transform: the source is
// Subjects[0] and the destination puts {{partition(N,w)}} first, where N
// is Partitions and w is the wildcard that holds the partition key's
// subject token, then the subject itself (each '*' as its
// {{wildcard(i)}}, a '>' kept). An error says why the input cannot be
// partitioned by the server.
func (pt Partitioning) Transform() (src, dest string, err error) {
	if len(pt.Subjects) != 1 {
		return "", "", fmt.Errorf("input.subjects has %d subjects, scale-out needs exactly one (the stream's subject transform has one source)", len(pt.Subjects))
	}
	src = pt.Subjects[0]
	k, name := pt.Field, pt.FieldName
	if k.Source != keys.SourceSubject || k.SubjectToken < 1 {
		return "", "", fmt.Errorf("%s is %v; the server partitions on a subject token counted from the start (%s.source: subject, %s.subject_token >= 1): "+
			"other keys need the route step (scale_out.route auto or always)", name, k, name, name)
	}
	toks := strings.Split(src, ".")
	if k.SubjectToken > len(toks) || toks[k.SubjectToken-1] != "*" {
		return "", "", fmt.Errorf("%s.subject_token %d is not a '*' token of input.subjects[0] %q; the server can partition on a single-token wildcard only",
			name, k.SubjectToken, src)
	}
	wild, keyWild := 0, 0
	out := make([]string, len(toks))
	for i, t := range toks {
		switch t {
		case "*":
			wild++
			out[i] = fmt.Sprintf("{{wildcard(%d)}}", wild)
			if i == k.SubjectToken-1 {
				keyWild = wild
			}
		default:
			out[i] = t
		}
	}
	dest = fmt.Sprintf("{{partition(%d,%d)}}.%s", pt.Partitions, keyWild, strings.Join(out, "."))
	if _, err := server.NewSubjectTransform(src, dest); err != nil {
		return "", "", fmt.Errorf("subject transform %q -> %q: %w", src, dest, err)
	}
	return src, dest, nil
}

// Routed decides whether the route step runs, the one place that does:
// with Route always, or auto when the server cannot partition the input
// itself (Transform fails: the key is a header or a JSON field, or not a
// single-token wildcard of the one input subject). why says which and
// why, for the logs and check-config.
func (pt Partitioning) Routed() (routed bool, why string) {
	switch pt.Route {
	case RouteAlways:
		return true, "scale_out.route is always"
	case RouteNever:
		return false, "scale_out.route is never: the input stream's transform partitions by the partition key's token"
	}
	if _, _, err := pt.Transform(); err != nil {
		return true, "scale_out.route is auto and the server cannot partition the input by the " + pt.FieldName + " itself: " + err.Error()
	}
	return false, "scale_out.route is auto and the " + pt.FieldName + " is a subject token: the input stream's transform partitions by it"
}
