// Package casetest runs a configuration's own tests, `dedupe-stage test`:
// a cases file beside the configuration (configs/<name>.cases.yaml next to
// configs/<name>.yaml) lists cases, each a sequence of messages (subject,
// headers, payload, time offset) with what must happen to each:
// forwarded (with its output subject and Nats-Msg-Id), repeat, stale,
// dead-lettered with its reason, or dropped.
//
// Each case runs the real stage (package stage, as `run` does) on a fresh
// in-process nats-server that listens on no port, with its JetStream
// store and the stage's data dir in a temporary directory: nothing outside
// the process is touched (Isolate says what of the configuration is
// replaced). A message is published at the case time of its offset
// (stage.Options.InputTime) once the one before it is judged, and its
// verdict is read from the output stream, the dead-letter stream and the
// stage's dedupe_messages_total. configs/README.md, "Testing a
// configuration", gives the file format.
package casetest
