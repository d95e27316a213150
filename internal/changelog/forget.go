package changelog

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

// HeaderAfter is set on a forward of a key whose previous forward's window
// had ended when this copy came (by the input's clock): that previous
// forward's first-seen time, Unix nanoseconds in decimal.
const HeaderAfter = "Dedupe-After"

// afterSep separates the id from the previous forward's time in AfterID.
const afterSep = ".after."

// AfterID returns the Nats-Msg-Id of a forward (id as ForwardID made it)
// of a key forwarded before with first-seen time prev, whose window had
// ended when this copy came: id + ".after." + prev's Unix nanoseconds. W
// runs on the input's clock and the output's duplicate window on the
// servers', so two forwards of one key W apart by the input can be
// published seconds apart (a backlog judged after a stop), and the output
// would drop the second if it had the same id. The id follows from the
// input alone: every copy of the new window, and every instance, gives the
// same one.
func AfterID(id string, prev time.Time) string {
	return id + afterSep + strconv.FormatInt(prev.UnixNano(), 10)
}

// AnnotateAfter sets HeaderAfter on h, the headers of a forward whose id
// is AfterID(id, prev), so that KeyOf finds the key.
func AnnotateAfter(h nats.Header, prev time.Time) {
	h.Set(HeaderAfter, strconv.FormatInt(prev.UnixNano(), 10))
}

// KeyOf returns the key of a forward with Nats-Msg-Id id and headers h:
// id, without what AfterID added when h carries HeaderAfter and what
// ForwardID added when h carries HeaderForgotten. ok is false when id does
// not end as those headers say it must.
func KeyOf(h nats.Header, id string) (key string, ok bool) {
	if a := h.Get(HeaderAfter); a != "" {
		if id, ok = strings.CutSuffix(id, afterSep+a); !ok {
			return id, false
		}
	}
	f := h.Get(HeaderForgotten)
	if f == "" {
		return id, true
	}
	return strings.CutSuffix(id, forgottenSep+f)
}
