package handover

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// HeaderForgotten is set on the first forward of a key after an operator
// forgot it: when the key was forgotten, Unix nanoseconds in decimal.
const HeaderForgotten = "Dedupe-Forgotten"

// forgottenSep separates the key from the forget's time in ForwardID.
const forgottenSep = ".forgotten."

// ForwardID returns the Nats-Msg-Id of a forward of key: key itself, or,
// for the first forward after the key was forgotten at forgotten (not
// zero), key + ".forgotten." + its Unix nanoseconds. The output stream's
// duplicate window may still hold the key's earlier forward, and would
// drop a second message with the same id.
func ForwardID(key string, forgotten time.Time) string {
	if forgotten.IsZero() {
		return key
	}
	return key + forgottenSep + strconv.FormatInt(forgotten.UnixNano(), 10)
}

// AnnotateForgotten sets HeaderForgotten on h, the headers of a forward
// whose id is ForwardID(key, forgotten), so that KeyOf finds the key.
func AnnotateForgotten(h nats.Header, forgotten time.Time) {
	h.Set(HeaderForgotten, strconv.FormatInt(forgotten.UnixNano(), 10))
}

// KeyOf returns the key of a forward with Nats-Msg-Id id and headers h:
// id, or the key ForwardID put in it when h carries HeaderForgotten. ok is
// false when h carries HeaderForgotten and id does not end as ForwardID
// makes it.
func KeyOf(h nats.Header, id string) (key string, ok bool) {
	f := h.Get(HeaderForgotten)
	if f == "" {
		return id, true
	}
	return strings.CutSuffix(id, forgottenSep+f)
}
