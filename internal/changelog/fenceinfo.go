package changelog

import (
	"encoding/json"
	"fmt"
	"time"
)

// Fence is what a fence message says: the instance that wrote it (Take or
// Refresh) and when, by that instance's clock.
type Fence struct {
	// Instance is the writer's scale_out.instance.
	Instance string
	// Time is when the writer wrote it.
	Time time.Time
}

// ParseFence decodes the body of a fence message (a message on a
// FenceSubject), for tools that show who holds a partition.
func ParseFence(data []byte) (Fence, error) {
	var b fenceBody
	if err := json.Unmarshal(data, &b); err != nil {
		return Fence{}, fmt.Errorf("changelog: fence message: %w", err)
	}
	return Fence(b), nil
}

// HandOver records a partition's last takeover: who took it, when, and
// what its restore cost. The new owner keeps it in the group's hand-over
// bucket under the partition's member name, so that a tool reading the
// cluster can show it while every instance is down.
type HandOver struct {
	// Instance is the new owner's scale_out.instance.
	Instance string `json:"instance"`
	// At is when the takeover began, by the new owner's clock.
	At time.Time `json:"at"`
	// Fence is the sequence of the fence message it wrote.
	Fence uint64 `json:"fence"`
	// Path is how it restored the partition: snapshot, local or full.
	Path string `json:"path"`
	// Records is how many records it restored.
	Records int `json:"records"`
	// RestoreSeconds is how long the takeover took, fence and restore.
	RestoreSeconds float64 `json:"restore_seconds"`
}
