package batcher

import "time"

// Progress paces the "still being worked on" signals (JetStream's
// InProgress) of a batch whose work may outlast its consumer's AckWait:
// one every third of AckWait, so that a batch held up by retries is
// neither redelivered meanwhile nor signalled once per retry. The zero
// value is due at once; it is not safe for concurrent use.
type Progress struct{ last time.Time }

// Start records the batch's delivery, now, as its last signal.
func (p *Progress) Start(now time.Time) { p.last = now }

// Due reports whether a third of ackWait has passed since the last signal;
// when it has, the caller signals the batch, and Due records the time.
func (p *Progress) Due(ackWait time.Duration) bool {
	now := time.Now()
	if now.Sub(p.last) < ackWait/3 {
		return false
	}
	p.last = now
	return true
}
