package admin

import (
	"errors"
	"time"
)

// What an instance answers, the bodies of the replies. The stage fills
// them (its Inspect, Forget and Status); the client reads them.

// Inspection is the answer of /inspect for one key. Its times are on the
// input stream's clock (when the input stored a copy), as every decision
// of the stage is: FirstSeen and LeavesAt are input times, and
// InsideWindow and Age are as of AsOf, the newest input time the key's
// partition has judged.
type Inspection struct {
	Key          string     `json:"key"`
	Found        bool       `json:"found"`
	InsideWindow bool       `json:"inside_window"`
	Partition    int        `json:"partition,omitempty"`
	FirstSeen    *time.Time `json:"first_seen,omitempty"`
	LeavesAt     *time.Time `json:"leaves_window_at,omitempty"`
	// AsOf is the newest input time the partition has judged since the
	// stage started; absent before its first message, when InsideWindow
	// is true for any record not forgotten and Age is absent.
	AsOf        *time.Time `json:"as_of,omitempty"`
	Age         string     `json:"age,omitempty"`
	Fingerprint string     `json:"fingerprint,omitempty"`
	// Forgotten is when an operator forgot the key (Stage.Forget): its
	// next copy is forwarded, and InsideWindow is false.
	Forgotten *time.Time `json:"forgotten_at,omitempty"`
	// Version is the key's recorded version, with key.version set.
	Version *uint64 `json:"version,omitempty"`
	// OutputSeq is the output stream sequence of the key's forward; absent
	// when its record predates it.
	OutputSeq *uint64 `json:"output_seq,omitempty"`
	Window    string  `json:"window"`
}

// ErrBadInspectKey means a key the store cannot hold (empty, or longer
// than state.MaxKeySize): the stage's inspect and forget return it, and
// the service answers it with code 400.
var ErrBadInspectKey = errors.New("stage: bad key to inspect")

// Answer is one instance's answer about a key: the inspection of its store,
// whether it owns the key's partition, and which partitions it owns.
type Answer struct {
	Inspection
	// Owner is true when this instance owns the key's partition: always
	// for a single instance; in a group, when the key was found in a
	// partition this instance holds now.
	Owner bool `json:"owner"`
	Coverage
}

// Forgot is what an instance's forget did (stage.Stage.Forget), the body of
// its ForgetReply.
type Forgot struct {
	// Key is the key forgotten, as stored (with its scope prefix).
	Key string `json:"key"`
	// Held is true when the stage held the key (a record inside the
	// window, not forgotten before) and forgot it; false means nothing
	// changed.
	Held bool `json:"held"`
	// Owner is true when this instance owns the key's partition and so
	// decided the forget: always for a single instance; in a group, when
	// the key was found in a partition this instance holds now. Another
	// instance's answer changes nothing.
	Owner bool `json:"owner"`
	// Partition is the key's partition, when Held.
	Partition *int `json:"partition,omitempty"`
	// FirstSeen is when the forgotten record's key was first seen, when
	// Held.
	FirstSeen *time.Time `json:"first_seen,omitempty"`
	// Applied is when the forget was applied (the stage's clock): the
	// first copy judged after it is forwarded.
	Applied time.Time `json:"applied_at"`
	Coverage
}

// Coverage says which partitions an instance owned when it answered, so
// that a client asking every instance of a group knows when the owners of
// all partitions have answered: once they have, and none holds the key,
// no instance does (admin.Client).
type Coverage struct {
	// Partitions is the partition count; 0 from an instance that does not
	// say (an older version).
	Partitions int `json:"partitions"`
	// Owned lists the partitions this instance owned when it answered: all
	// of them for a single instance, none for an instance of a group that
	// owns nothing yet.
	Owned []int `json:"owned"`
}

// InstanceStatus is an instance's status as the admin service reports it
// (Stage.Status).
type InstanceStatus struct {
	// Ready is true once every filter is ready, while the stage runs.
	Ready bool `json:"ready"`
	// Problem lists what keeps failing; "" when healthy.
	Problem string `json:"problem,omitempty"`
	// Window is the dedupe window W.
	Window string `json:"window"`
	// Partitions is the partition count.
	Partitions int `json:"partitions"`
	// Owned lists the partitions this instance owns now: all of them for a
	// single instance.
	Owned []int `json:"owned"`
	// Restoring maps partitions being restored to the records read back.
	Restoring map[int]int `json:"restoring,omitempty"`
	// KeysInFilters is how many keys the filters hold.
	KeysInFilters uint64 `json:"keys_in_filters"`
	// Traffic is what the instance has judged and how its input and
	// connection stand; nil from an older version.
	Traffic *Traffic `json:"traffic,omitempty"`
}

// Traffic is what an instance has judged since it started, and how its
// input and its NATS connection stand: the counters of its metrics, read
// when it answered, for `dedupe-stage top`. It holds counts, not rates: a
// rate is the difference of two answers over the difference of their At.
type Traffic struct {
	// At is when the instance read the counts, on its clock.
	At time.Time `json:"at"`
	// Partitions are every partition's counts of messages judged by this
	// instance (dedupe_messages_total), in order: those it owned before a
	// hand-over keep what it judged while it owned them.
	Partitions []PartitionTraffic `json:"partitions"`
	// UnpartitionedDeadLetters counts inputs dead-lettered before they
	// reached a partition (dedupe_unpartitioned_dead_letters_total).
	UnpartitionedDeadLetters uint64 `json:"unpartitioned_dead_letters"`
	// DeadLetters counts every dead letter by reason, those above 0 only
	// (dedupe_dead_letters_total).
	DeadLetters map[string]uint64 `json:"dead_letters"`
	// RepeatAgeP99 is the 99th percentile of the ages of the repeats
	// caught since start, in seconds, interpolated in the buckets of
	// dedupe_repeat_age_seconds as histogram_quantile does; nil before the
	// first repeat.
	RepeatAgeP99 *float64 `json:"repeat_age_p99_seconds,omitempty"`
	// NearWindowEnd counts repeats caught past window.near_fraction of W
	// (dedupe_repeats_near_window_end_total).
	NearWindowEnd uint64 `json:"repeats_near_window_end"`
	// Backlog is the input backlog of the partitions this instance owns
	// (all of them for a single instance), as it last polled it
	// (dedupe_consumer_pending_messages); nil before its first poll.
	Backlog *Backlog `json:"backlog,omitempty"`
	// NATS is how the instance's NATS connection stands.
	NATS NATSState `json:"nats"`
}

// PartitionTraffic is one partition's messages judged by an instance, by
// outcome (dedupe_messages_total), and its input backlog when the
// instance polled it per partition (a group's owner).
type PartitionTraffic struct {
	Partition  int    `json:"partition"`
	New        uint64 `json:"new"`
	Repeat     uint64 `json:"repeat"`
	Stale      uint64 `json:"stale"`
	DeadLetter uint64 `json:"dead_letter"`
	Dropped    uint64 `json:"dropped"`
	// Backlog is the partition's member consumer's backlog, in a group,
	// for a partition the instance owned at its last poll; nil otherwise.
	Backlog *Backlog `json:"backlog,omitempty"`
}

// Judged is how many messages the partition judged: every outcome.
func (p PartitionTraffic) Judged() uint64 {
	return p.New + p.Repeat + p.Stale + p.DeadLetter + p.Dropped
}

// Backlog is a consumer's backlog: messages not yet delivered (Pending)
// and delivered but not acknowledged (AckPending).
type Backlog struct {
	Pending    uint64 `json:"pending"`
	AckPending uint64 `json:"ack_pending"`
}

// NATSState is how an instance's NATS connection stands. An instance that
// answers is connected to some server; Connected false is seen only in a
// reply sent as the link came back.
type NATSState struct {
	// Connected is true while the connection is up.
	Connected bool `json:"connected"`
	// Server is the URL of the server it is connected to, without
	// credentials.
	Server string `json:"server,omitempty"`
	// Reconnects counts how often it was lost and made again.
	Reconnects uint64 `json:"reconnects"`
}
