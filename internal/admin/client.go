package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ErrNoAnswer means no instance answered a request: none runs with the
// service on that subject, or the connection's user may not publish to it.
var ErrNoAnswer = errors.New("admin: no instance answered")

// DefaultTimeout is how long Client waits for answers.
const DefaultTimeout = 5 * time.Second

// Client asks the instances of one stage, on the subject prefix they
// serve (config.Config.AdminSubject). It is safe for concurrent use.
type Client struct {
	// Conn is the connection to ask on.
	Conn *nats.Conn
	// Subject is the endpoints' subject prefix.
	Subject string
	// Timeout bounds each call when ctx has no earlier deadline. Default
	// DefaultTimeout.
	Timeout time.Duration
}

// Inspect asks every instance about key and returns the answer of the
// instance that owns the key's partition (the only one, for a single
// instance). When none says it owns it, it returns an answer Found false as
// soon as the answers cover every partition (the owners of all partitions
// answered, and none found the key: no instance holds it); else, once the
// time is up, the answer of an instance that found the key, or any answer
// (a hand-over in progress, a partition no instance owns yet, or an
// instance that does not say which partitions it owns).
func (c Client) Inspect(ctx context.Context, key string) (InspectReply, error) {
	var best InspectReply
	var got, found bool
	var cov coverage
	err := c.scatter(ctx, EndpointInspect, []byte(key), func(data []byte) (bool, error) {
		var r InspectReply
		if err := json.Unmarshal(data, &r); err != nil {
			return false, fmt.Errorf("admin: inspect: bad answer: %w", err)
		}
		if !got || r.Owner || (r.Found && !best.Found) {
			best, got = r, true
		}
		found = found || r.Found
		cov.add(r.Coverage)
		return r.Owner || (!found && cov.complete()), nil
	})
	if got && (err == nil || errors.Is(err, context.DeadlineExceeded)) {
		return best, nil
	}
	return InspectReply{}, err
}

// Forget asks every instance to forget key and returns the answer of the
// owner of the key's partition (the only instance, for a single one):
// when it was applied, and whether the stage held the key. The other
// instances of a group change nothing and answer Owner false. When none
// says it owns it, it returns one of their answers (Held false) as soon as
// the answers cover every partition, as Inspect does; else once the time
// is up.
func (c Client) Forget(ctx context.Context, key string) (ForgetReply, error) {
	var best ForgetReply
	var got, held bool
	var cov coverage
	err := c.scatter(ctx, EndpointForget, []byte(key), func(data []byte) (bool, error) {
		var r ForgetReply
		if err := json.Unmarshal(data, &r); err != nil {
			return false, fmt.Errorf("admin: forget: bad answer: %w", err)
		}
		if !got || r.Owner {
			best, got = r, true
		}
		held = held || r.Held
		cov.add(r.Coverage)
		return r.Owner || (!held && cov.complete()), nil
	})
	if got && (err == nil || errors.Is(err, context.DeadlineExceeded)) {
		return best, nil
	}
	return ForgetReply{}, err
}

// coverage is the union of the partitions the answers to one request say
// their instances own (Coverage). It is complete once every
// partition is in it: the owners of all partitions have answered. Answers
// that disagree on the partition count never complete it; an answer with
// no count (an older instance) adds nothing.
type coverage struct {
	owned []bool // by partition; nil before an answer with a count
	left  int    // partitions no answer owns yet
	mixed bool   // answers disagreed on the partition count
}

// add adds the partitions of one answer.
func (c *coverage) add(a Coverage) {
	if a.Partitions <= 0 || c.mixed {
		return
	}
	if c.owned == nil {
		c.owned, c.left = make([]bool, a.Partitions), a.Partitions
	}
	if a.Partitions != len(c.owned) {
		c.mixed = true
		return
	}
	for _, p := range a.Owned {
		if p >= 0 && p < len(c.owned) && !c.owned[p] {
			c.owned[p] = true
			c.left--
		}
	}
}

// complete reports whether the answers so far own every partition, with
// one partition count.
func (c *coverage) complete() bool { return c.owned != nil && !c.mixed && c.left == 0 }

// Status asks every instance for its status and returns the answers that
// came before the time was up.
func (c Client) Status(ctx context.Context) ([]StatusReply, error) {
	var all []StatusReply
	err := c.scatter(ctx, EndpointStatus, nil, func(data []byte) (bool, error) {
		var r StatusReply
		if err := json.Unmarshal(data, &r); err != nil {
			return false, fmt.Errorf("admin: status: bad answer: %w", err)
		}
		all = append(all, r)
		return false, nil
	})
	if len(all) > 0 && errors.Is(err, context.DeadlineExceeded) {
		return all, nil
	}
	return all, err
}

// scatter sends data to the endpoint of every instance and hands each
// answer to take until take says it is done, returns an error, or the
// time is up (an error wrapping context.DeadlineExceeded, or ErrNoAnswer
// when nothing came). An instance's error answer ends it with that error.
func (c Client) scatter(ctx context.Context, endpoint string, data []byte, take func([]byte) (bool, error)) error {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	subject := c.Subject + "." + endpoint
	inbox := c.Conn.NewRespInbox()
	sub, err := c.Conn.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("admin: %s: %w", subject, err)
	}
	defer sub.Unsubscribe()
	if err := c.Conn.PublishRequest(subject, inbox, data); err != nil {
		return fmt.Errorf("admin: %s: %w", subject, err)
	}
	answers := 0
	for {
		m, err := sub.NextMsgWithContext(ctx)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return fmt.Errorf("%w on %s: nothing subscribes to it (is the stage running with the admin service on, with this admin.subject?)", ErrNoAnswer, subject)
		case err != nil && answers > 0:
			return fmt.Errorf("admin: %s: %w", subject, err)
		case err != nil:
			return c.noAnswer(subject, timeout)
		}
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			return fmt.Errorf("admin: %s: %s (%s)", subject, m.Header.Get(micro.ErrorHeader), code)
		}
		answers++
		done, err := take(m.Data)
		if err != nil || done {
			return err
		}
	}
}

// noAnswer is ErrNoAnswer naming the subject, with the connection's last
// error when the server refused the publish.
func (c Client) noAnswer(subject string, timeout time.Duration) error {
	why := "is the stage running with the admin service on, with this admin.subject?"
	if err := c.Conn.LastError(); err != nil {
		why = err.Error()
	}
	return fmt.Errorf("%w on %s within %v (%s)", ErrNoAnswer, subject, timeout, why)
}
