package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ServiceName is the micro service's name, the same on every instance.
const ServiceName = "dedupe-stage"

// Endpoint names, the last token of their subjects.
const (
	EndpointInspect = "inspect"
	EndpointForget  = "forget"
	EndpointStatus  = "status"
)

// Stage is what the service asks, implemented by the stage package's
// *stage.Stage; declared here so that this package imports nothing of the
// stage.
type Stage interface {
	Inspect(ctx context.Context, key string) (Answer, error)
	Forget(ctx context.Context, key string) (Forgot, error)
	Status() InstanceStatus
}

// InspectReply is an instance's answer to inspect.
type InspectReply struct {
	// Instance names the instance that answered.
	Instance string `json:"instance"`
	Answer
}

// ForgetReply is an instance's answer to forget.
type ForgetReply struct {
	// Instance names the instance that applied the forget.
	Instance string `json:"instance"`
	Forgot
}

// StatusReply is an instance's answer to status.
type StatusReply struct {
	// Instance names the instance that answered.
	Instance string `json:"instance"`
	InstanceStatus
}

// DefaultForgetTimeout bounds how long a forget waits for the batch in
// flight on the key's partition, and how long an inspect or a forget
// takes to confirm the partitions its answer covers.
const DefaultForgetTimeout = 10 * time.Second

// Options configure Serve.
type Options struct {
	// Conn is the connection the service answers on. Required.
	Conn *nats.Conn
	// Subject is the endpoints' subject prefix. Required.
	Subject string
	// Instance names this instance in replies and in the service's
	// metadata.
	Instance string
	// Version is the service's version: a semantic version, or "0.0.0".
	Version string
	// Stage answers the requests. Required.
	Stage Stage
	// Logger receives the service's errors. Default slog.Default().
	Logger *slog.Logger
	// ForgetTimeout: default DefaultForgetTimeout.
	ForgetTimeout time.Duration
}

// Serve adds the admin service to o.Conn; the caller stops it with
// Stop before closing the connection.
func Serve(o Options) (micro.Service, error) {
	if o.Conn == nil || o.Stage == nil || o.Subject == "" {
		return nil, errors.New("admin: Options.Conn, Stage and Subject are required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ForgetTimeout <= 0 {
		o.ForgetTimeout = DefaultForgetTimeout
	}
	if o.Version == "" {
		o.Version = "0.0.0"
	}
	svc, err := micro.AddService(o.Conn, micro.Config{
		Name:        ServiceName,
		Version:     o.Version,
		Description: "inspect and forget dedupe keys, and this instance's status",
		Metadata:    map[string]string{"instance": o.Instance, "subject": o.Subject},
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			o.Logger.Warn("admin service error", "subject", e.Subject, "err", e.Description)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("admin: add service on %s: %w", o.Subject, err)
	}
	h := handlers{o}
	for name, fn := range map[string]micro.HandlerFunc{
		EndpointInspect: h.inspect,
		EndpointForget:  h.forget,
		EndpointStatus:  h.status,
	} {
		if err := svc.AddEndpoint(name, fn, micro.WithEndpointSubject(o.Subject+"."+name), micro.WithEndpointQueueGroupDisabled()); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("admin: add endpoint %s.%s: %w", o.Subject, name, err)
		}
	}
	return svc, nil
}

// handlers answer the endpoints.
type handlers struct{ o Options }

func (h handlers) inspect(r micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), h.o.ForgetTimeout)
	defer cancel()
	a, err := h.o.Stage.Inspect(ctx, string(r.Data()))
	if err != nil {
		h.fail(r, err)
		return
	}
	_ = r.RespondJSON(InspectReply{Instance: h.o.Instance, Answer: a})
}

func (h handlers) forget(r micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), h.o.ForgetTimeout)
	defer cancel()
	f, err := h.o.Stage.Forget(ctx, string(r.Data()))
	if err != nil {
		h.fail(r, err)
		return
	}
	_ = r.RespondJSON(ForgetReply{Instance: h.o.Instance, Forgot: f})
}

func (h handlers) status(r micro.Request) {
	_ = r.RespondJSON(StatusReply{Instance: h.o.Instance, InstanceStatus: h.o.Stage.Status()})
}

// fail answers r with err as a micro error: 400 for a bad key, else 503.
func (h handlers) fail(r micro.Request, err error) {
	code := "503"
	switch {
	case errors.Is(err, ErrBadInspectKey):
		code = "400"
	}
	_ = r.Error(code, err.Error(), nil)
}
