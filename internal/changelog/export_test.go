package changelog

import "time"

// SetRestoreTimings sets how long Restore waits for one message, how long
// a quiet reader lasts before Restore opens another, and how long Restore
// waits with no message before it gives up; the returned func puts the
// defaults back.
func SetRestoreTimings(idle, reopen, stall time.Duration) (reset func()) {
	i, r, s := restoreIdle, restoreReopen, restoreStall
	restoreIdle, restoreReopen, restoreStall = idle, reopen, stall
	return func() { restoreIdle, restoreReopen, restoreStall = i, r, s }
}

// SetStepBound sets how long one takeover step retries (StepBound); the
// returned func puts the default back.
func SetStepBound(d time.Duration) (reset func()) {
	b := stepBound
	stepBound = d
	return func() { stepBound = b }
}
