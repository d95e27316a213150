// Package containertest checks the deployment kit against the real thing.
//
// TestContainer builds both images with deploy/build-images.sh (the stage on
// FROM scratch, and nats-server with JetStream), runs them on a private
// Docker network and checks the README's guarantee through the containers:
// each key forwarded once, a clean exit on SIGTERM, nothing forwarded again
// after a restart on the same volume, a healthy container, and metrics that
// pass `promtool check metrics`. It is skipped, saying why, when no Docker
// engine answers.
//
// TestContainerScaleOut runs scale-out as deployed: a 3-node cluster of the
// project's nats-server image on the test's network and two stage containers
// in one group (header keys, so the route step runs; streams of three
// replicas, created by the first). Keys published with copies are forwarded
// once each and the partitions are shared fairly; then one stage is stopped
// with SIGTERM and the other owns every partition and forwards a second
// batch once while recognising copies of the first.
//
// The other tests check the operator's files without Docker: the alert rules
// (`promtool check rules` and the unit tests in testdata/alerts_test.yml),
// the Prometheus config, the compose file, the Dockerfiles, and that the
// Grafana dashboard and the alerts name only metrics the code exports while
// the dashboard shows every metric of the stage, and that docs/metrics.md
// describes every metric and no other. Tests that need promtool
// (Debian package prometheus) are skipped, saying why, without it.
//
// TestContainer and TestContainerScaleOut run in parallel, each on its own
// network and volume with ports Docker picks, sharing the images.
//
// The package holds tests only.
package containertest
