// Package route is the route step of scale-out: a stateless router that
// puts a message's partition in its subject when the key is not a subject
// token (a header, such as the default Nats-Msg-Id, or a JSON field), so
// that a static consumer group can hand partitions to instances.
//
// Every instance runs Run on one shared durable pull consumer on the input
// stream (ConsumerName, competing consumers, explicit ack). For each
// message it extracts the key with the stage's own keys.KeyFunc (and the
// partition key, when it is not the key), computes
// p = state.PartitionFNV(partition key, N), the partition nats-server's
// {{partition(N,k)}} would pick for that token, and publishes a copy to
// the routed stream at Subject(p, routed subject, input subject) with
// Nats-Msg-Id MsgID(input stream, input sequence). Only once the routed
// stream has stored the copy is the input acked. The id is the same on
// every delivery and in every instance, so the routed stream's duplicate
// window drops a copy routed again after a redelivery or by another
// instance. With Options.Local, an input of a partition the caller owns
// is handed to it instead, with no copy: the caller judges and acks it.
//
// The copy keeps the input's headers and payload, except the input's
// publish directives (forward.IsDirective: checks against the input
// stream, its atomic batch, a rollup, ...) and its Nats-Msg-Id (replaced; kept in HeaderOriginalMsgID), and adds
// HeaderKey, HeaderInputTime, HeaderInputStream and HeaderInputSequence. A message the route step cannot route (no
// key, a bad payload, a key too long, a message too large, a copy the
// routed stream refuses for good) is dead-lettered with its reason, as the
// stage dead-letters it, and then acked: nothing is dropped silently.
//
// Use:
//
//	err := route.Run(ctx, route.Options{
//		Conn: nc, InputStream: "EVENTS", Group: "dedupe", Partitions: 16,
//		RoutedStream: "DEDUPE_ROUTED", RoutedSubject: "dedupe.routed",
//		Key: kf, DeadLetterSubject: cfg.DeadLetter.SubjectFor,
//	})
//
// # Publishing
//
// Run keeps Options.BatchesInFlight batches in flight (DefaultBatchesInFlight)
// and publishes each batch's copies as one atomic batch: the routed stream
// is created with atomic publish allowed, and one without it is routed one
// publish per copy, with a warning. A batch's dead letters go together
// beside its copies, through the stage's own dead-letter publisher
// (deadletter.Publisher). The input is read with the stage's pull loop
// (pull.Run): a pull lasts at most ack_wait, so a pull a cluster leaves
// unanswered costs that long, not the client's 30 s default.
// StreamConfig and CheckStream own the routed stream's settings: a work
// queue, one subject per partition, a duplicate window of 2 x (ack_wait +
// restart margin) and at least 2 minutes; Run refuses a window below ack_wait
// + restart margin.
//
// # Reading a routed message
//
// OriginOfMsg and InputOfMsg read where a routed message came from, for a
// copy alone or a bundle's part (Unbundle), so that its dead letter names
// the input's stream and sequence and carries the input's dead-letter id; a
// copy routed before the input headers existed falls back to its route id.
//
// # Bundle forms
//
// Each instance lists in the presence bucket the bundle forms it reads
// ("reads_bundle_forms": [1, 2], beside "reads_bundle_form": "1" that the
// first version with bundles reads; a version before bundles puts the time
// alone). The route step writes the newest form every live instance lists,
// once its watch has seen every key, and copies alone while one lists none
// (TestBundleFormOfAMixedGroup, TestScaleOutBundlesWaitForEveryInstance).
// Form 2 carries the route step's additions as fields, so neither side
// builds or parses six headers per input: a profile of form 1 found that
// work in the route step, in unbundling and in the forwarded copy
// (bench/RESULTS.md). bundle.go has the byte layout.
package route
