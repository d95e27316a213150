// Package admin serves a stage instance's operator actions as a NATS
// service (nats.go/micro), and is the client the CLI asks them with.
//
// Every instance adds the service "dedupe-stage" with three endpoints
// under one subject prefix (config.Config.AdminSubject, by default
// "dedupe.admin.<consumer or group>"):
//
//	<prefix>.inspect   request: a key; reply: InspectReply (JSON)
//	<prefix>.forget    request: a key; reply: ForgetReply (JSON)
//	<prefix>.status    request: empty; reply: StatusReply (JSON)
//
// Each action has its own subject, so NATS permissions alone decide who
// may inspect and who may forget (allow <prefix>.inspect, deny
// <prefix>.forget). The endpoints have no queue group: every instance of a
// group receives each request and answers for itself, and the client takes
// the answer of the instance that owns the key's partition. Each answer
// also lists the partitions its instance owns (Coverage), so that
// the client answers a key no instance holds (not found, not held) as
// soon as the owners of all partitions have answered, instead of at its
// timeout. Being a micro
// service, `nats micro ls`, `nats micro info dedupe-stage` and `nats micro
// stats dedupe-stage` list the instances and count their requests.
//
// A refused request is a micro error reply (Nats-Service-Error-Code): 400
// for a key the store cannot hold, 501 for an action this mode does not
// offer, 503 when the stage cannot answer now.
package admin
