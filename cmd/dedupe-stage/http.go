package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// serveHTTP starts the operator endpoints as cfg says: /metrics, /healthz
// and /readyz on cfg.Addr; /inspect there too, on its own listener
// (cfg.InspectAddr), or nowhere (cfg.Inspect false). It returns the
// function that shuts them down.
func serveHTTP(cfg config.HTTP, reg prometheus.Gatherer, status *stage.Health, log *slog.Logger) (stop func(), err error) {
	var servers []*http.Server
	stop = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, srv := range servers {
			_ = srv.Shutdown(sctx)
		}
	}
	serve := func(field, addr string, h http.Handler, what string) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s %s: %w", field, addr, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", "addr", addr, "err", err)
			}
		}()
		log.Info("serving "+what, "addr", ln.Addr().String())
		return nil
	}
	inspectAddr := cfg.InspectOn()
	if cfg.Addr != "" {
		h, what := stage.NewHealthHandler(reg, status), "/metrics /healthz /readyz"
		if inspectAddr == cfg.Addr {
			h, what = stage.NewHandler(reg, status), "/metrics /healthz /readyz /inspect"
		}
		if err := serve("http.addr", cfg.Addr, h, what); err != nil {
			return stop, err
		}
	}
	if inspectAddr != "" && inspectAddr != cfg.Addr {
		if err := serve("http.inspect_addr", inspectAddr, stage.NewInspectHandler(status), "/inspect"); err != nil {
			stop()
			return stop, err
		}
	}
	if inspectAddr == "" {
		log.Info("/inspect is off (http.inspect: false)")
	}
	return stop, nil
}
