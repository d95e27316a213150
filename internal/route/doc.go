// Package route is the route step of scale-out. Below are the notes on how
// it publishes, reads and bundles; the model follows them, and the design
// is docs/scale-out.md §3.2.
//
// # Publishing
//
// Run keeps Options.BatchesInFlight batches in flight (DefaultBatchesInFlight)
// and publishes each batch's copies as one atomic batch: the routed stream
// is created with atomic publish allowed, and one without it is routed one
// publish per copy, with a warning. A batch's dead letters go together
// beside its copies. A pull lasts at most ack_wait, so a pull a cluster
// leaves unanswered costs that long, not the client's 30 s default.
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
