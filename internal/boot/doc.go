// Package boot starts what a dedupe-stage process needs before its
// pipeline runs: the hold on the data directory (LockDataDir), the
// embedded nats-server of the single-instance default (StartEmbedded) and
// the NATS connection (Connect). None of it judges a message; the pipeline
// in package stage takes the connection as a value.
//
// The order main follows:
//
//	lock, err := boot.LockDataDir(cfg.State.DataDir, cfg.EmbeddedStoreDir())
//	defer lock.Release()
//	srv, err := boot.StartEmbedded(cfg, log) // only when cfg.NATS.IsEmbedded()
//	nc, err := boot.Connect(cfg.NATS, srv, log)
//	st, err := stage.New(ctx, stage.Options{Config: cfg, Conn: nc, ...})
package boot
