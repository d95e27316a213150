package deadletter

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dedupe-stage/dedupe-stage/keys"
)

// Reason says why an input was dead-lettered: a stable snake_case word that
// is the dead letter's HeaderReason, the last token of its subject and the
// reason label of the dead-letter metrics (docs/failures.md).
type Reason string

// Reasons of a key that cannot be extracted, the keys package's (keys.Error).
const (
	// ReasonNoKey: the key is absent or empty (keys.ReasonNoKey).
	ReasonNoKey Reason = keys.ReasonNoKey
	// ReasonBadPayload: the payload is not valid JSON, or names a member on the key's path twice (keys.ReasonBadPayload).
	ReasonBadPayload Reason = keys.ReasonBadPayload
	// ReasonBadKeyType: the JSON value at the key's path is not a string or a number (keys.ReasonBadKeyType).
	ReasonBadKeyType Reason = keys.ReasonBadKeyType
	// ReasonBadKey: the key is not valid UTF-8 or cannot be a header value (keys.ReasonBadKey).
	ReasonBadKey Reason = keys.ReasonBadKey
	// ReasonNoScope: a scope is configured and the message does not carry it (keys.ReasonNoScope).
	ReasonNoScope Reason = keys.ReasonNoScope
	// ReasonBadScope: the scope contains ':' or is not a string or a number (keys.ReasonBadScope).
	ReasonBadScope Reason = keys.ReasonBadScope
	// ReasonKeyTooLong: the final key is longer than the configured maximum (keys.ReasonKeyTooLong).
	ReasonKeyTooLong Reason = keys.ReasonKeyTooLong
	// ReasonNoVersion: key.version is configured and the message does not carry it (keys.ReasonNoVersion).
	ReasonNoVersion Reason = keys.ReasonNoVersion
	// ReasonBadVersion: the version is not a decimal integer from 0 to 18446744073709551615 (keys.ReasonBadVersion).
	ReasonBadVersion Reason = keys.ReasonBadVersion
)

// Reasons of the stage's dispatch, forward and state paths.
const (
	// ReasonOversized: the input, or its forwarded or routed copy with the added headers, does not fit the limits.
	ReasonOversized Reason = "oversized"
	// ReasonMaxDeliver: the input reached its consumer's max_deliver, dead-lettered so the server cannot drop it.
	ReasonMaxDeliver Reason = "max_deliver"
	// ReasonFingerprintMismatch: a repeat key came with a different payload, and fingerprint mismatches are not repeats.
	ReasonFingerprintMismatch Reason = "fingerprint_mismatch"
	// ReasonOutputRejected: the output stream refused the forward with an error no retry changes.
	ReasonOutputRejected Reason = "output_rejected"
	// ReasonStateRejected: the state store refused the key's lookup or claim with an error no retry changes.
	ReasonStateRejected Reason = "state_rejected"
	// ReasonNotRouted: a message in the routed stream that the route step did not write, or a bundle this version cannot read.
	ReasonNotRouted Reason = "not_routed"
)

// Reasons of the totals.
const (
	// ReasonNoGroup: the group field is missing.
	ReasonNoGroup Reason = "no_group"
	// ReasonBadGroup: the group is not usable as a total's group (not UTF-8, a control character, too long, or not a string or a number).
	ReasonBadGroup Reason = "bad_group"
	// ReasonBadTime: the event time is missing or neither RFC 3339 nor a Unix time in seconds or milliseconds.
	ReasonBadTime Reason = "bad_time"
	// ReasonBadValue: the value is missing or not a decimal integer from 0 to math.MaxInt64.
	ReasonBadValue Reason = "bad_value"
	// ReasonClosedBucket: a new event for a bucket already closed, with totals.late_events "dead-letter".
	ReasonClosedBucket Reason = "closed_bucket"
	// ReasonFutureTime: with scale-out, an event time further ahead of the clock than scale_out.max_event_time_ahead.
	ReasonFutureTime Reason = "future_time"
)

// Reasons of the route step.
const (
	// ReasonRoutedRejected: the routed stream refused the copy with an error no retry changes.
	ReasonRoutedRejected Reason = "routed_rejected"
	// ReasonNoPartitionKey: the partition key failed with an error that carries no keys.Error reason.
	ReasonNoPartitionKey Reason = "no_partition_key"
	// ReasonNoMetadata: the message carries no JetStream metadata, so it has no input sequence to route by.
	ReasonNoMetadata Reason = "no_metadata"
)

// InInput reports whether r lies in the input itself (its key, scope,
// version, payload, size, totals group, time or value, or, for
// fingerprint_mismatch and closed_bucket, what the stage holds of its key
// or bucket, which only moves further from accepting it): the same input
// republished under the same configuration is dead-lettered again for r.
// A redrive refuses such dead letters unless forced, after a change of
// configuration that accepts them. The other reasons (output_rejected,
// state_rejected, max_deliver, future_time, routed_rejected, no_metadata)
// have a cause outside the input that can be fixed, or pass, so that a
// copy can then be judged. docs/failures.md, "Redrive", lists both.
func (r Reason) InInput() bool {
	switch r {
	case ReasonNoKey, ReasonBadPayload, ReasonBadKeyType, ReasonBadKey, ReasonNoScope, ReasonBadScope, ReasonKeyTooLong,
		ReasonNoVersion, ReasonBadVersion, ReasonOversized, ReasonFingerprintMismatch, ReasonNotRouted,
		ReasonNoGroup, ReasonBadGroup, ReasonBadTime, ReasonBadValue, ReasonClosedBucket, ReasonNoPartitionKey:
		return true
	}
	return false
}

// KeyReason returns the Reason of the *keys.Error in err's chain with its detail, or fallback and err's text when there is none.
func KeyReason(err error, fallback Reason) (Reason, string) {
	var ke *keys.Error
	if errors.As(err, &ke) {
		return Reason(ke.Reason), ke.Detail
	}
	return fallback, err.Error()
}

// Reasons returns every Reason, in the order of docs/failures.md's groups: key, stage, totals, route step.
func Reasons() []Reason {
	return []Reason{
		ReasonNoKey, ReasonBadPayload, ReasonBadKeyType, ReasonBadKey, ReasonNoScope, ReasonBadScope, ReasonKeyTooLong, ReasonNoVersion, ReasonBadVersion,
		ReasonOversized, ReasonMaxDeliver, ReasonFingerprintMismatch, ReasonOutputRejected, ReasonStateRejected, ReasonNotRouted,
		ReasonNoGroup, ReasonBadGroup, ReasonBadTime, ReasonBadValue, ReasonClosedBucket, ReasonFutureTime,
		ReasonRoutedRejected, ReasonNoPartitionKey, ReasonNoMetadata,
	}
}

// ParseReason returns the Reason named s, or an error listing the reasons.
func ParseReason(s string) (Reason, error) {
	for _, r := range Reasons() {
		if string(r) == s {
			return r, nil
		}
	}
	names := make([]string, 0, len(Reasons()))
	for _, r := range Reasons() {
		names = append(names, string(r))
	}
	return "", fmt.Errorf("unknown dead-letter reason %q, want one of %s", s, strings.Join(names, ", "))
}
