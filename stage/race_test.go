//go:build race

package stage_test

// raceEnabled says the tests run with the race detector, which makes the
// largest ones too slow for the suite: they shrink and say so.
const raceEnabled = true
