package scaleout

import (
	"context"
	"slices"
	"time"
)

// pinCheckFault, when set (tests only), makes pinOf fail for partition p
// with the error it returns.
var pinCheckFault func(p int) error

// SetPinCheckFault makes every group's pin checks fail for partition p
// with f(p) when that is not nil, until the returned restore runs. It is
// for tests, which cannot take a consumer's leader away at a chosen
// moment; it is not safe to call while a group runs.
func SetPinCheckFault(f func(p int) error) (restore func()) {
	pinCheckFault = f
	return func() { pinCheckFault = nil }
}

// recheckLost is for a batch delivered under pin, a pin this worker counts
// as lost. A pin is counted lost on what the server said or could not say
// (a pin check that failed inside fenced, with the consumer's leader gone),
// so at most once per ack_wait it asks the server again: when the server
// still pins this instance under pin, the pin is not lost after all (the
// server delivers the partition to no one else, so without this the
// partition would stall), and it returns true: the batch takes the fence
// again and restores what another owner wrote meanwhile. Otherwise it
// returns false and the batch is left unacked for the partition's owner.
func (o *Owner) recheckLost(ctx context.Context, pin string) bool {
	g := o.g
	p := o.p.Index()
	g.mu.Lock()
	if g.rechecked == nil {
		g.rechecked = make(map[int]time.Time)
	}
	due := time.Since(g.rechecked[p]) >= g.consumer.AckWait
	if due {
		g.rechecked[p] = time.Now()
	}
	g.mu.Unlock()
	if !due {
		return false
	}
	now, err := o.g.pinOf(ctx, p)
	if err != nil || now != pin {
		return false
	}
	o.lostPins = slices.DeleteFunc(o.lostPins, func(l string) bool { return l == pin })
	o.g.logs.Warn("lost_pin_still_held", "scale-out: a pin counted as lost is still this instance's; taking the partition again", "partition", o.label)
	return true
}
