package handover

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
		return Fence{}, fmt.Errorf("handover: fence message: %w", err)
	}
	return Fence(b), nil
}
