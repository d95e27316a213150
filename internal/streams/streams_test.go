package streams_test

import (
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/streams"
)

func TestRequiredDuplicateWindow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ackWait time.Duration
		backoff []time.Duration
		margin  time.Duration
		want    time.Duration
	}{
		{"ack_wait plus margin", 10 * time.Second, nil, time.Minute, 70 * time.Second},
		{"backoff longer than ack_wait", 10 * time.Second, []time.Duration{time.Second, 30 * time.Second, 5 * time.Second}, time.Minute, 90 * time.Second},
		{"backoff shorter than ack_wait", 10 * time.Second, []time.Duration{time.Second}, 0, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := streams.RequiredDuplicateWindow(tc.ackWait, tc.backoff, tc.margin); got != tc.want {
				t.Errorf("RequiredDuplicateWindow(%v, %v, %v) = %v, want %v", tc.ackWait, tc.backoff, tc.margin, got, tc.want)
			}
		})
	}
}

func TestDuplicateWindow(t *testing.T) {
	for _, tc := range []struct {
		ackWait, margin, want time.Duration
	}{
		{10 * time.Second, streams.DefaultRestartMargin, 140 * time.Second},
		{time.Second, time.Second, streams.DefaultDuplicateWindow},
		{time.Minute, 5 * time.Minute, 12 * time.Minute},
	} {
		got := streams.DuplicateWindow(tc.ackWait, tc.margin)
		if got != tc.want {
			t.Errorf("DuplicateWindow(%v, %v) = %v, want %v", tc.ackWait, tc.margin, got, tc.want)
		}
		if need := streams.RequiredDuplicateWindow(tc.ackWait, nil, tc.margin); got < need {
			t.Errorf("DuplicateWindow(%v, %v) = %v, below the required %v", tc.ackWait, tc.margin, got, need)
		}
	}
}
