// Package boottest makes what connection tests need from scratch: a CA
// with server and client certificates, and an operator with an account
// and a user whose creds file a server in operator mode accepts. It is for
// tests only.
//
//	pki := boottest.NewPKI(t)
//	srv := natstest.RunServerWith(t, pki.ServerTLS(true))    // mutual TLS, handshake first
//	op := boottest.NewOperator(t)
//	srv := natstest.RunServerWith(t, op.Configure)           // creds: op.CredsFile
package boottest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// PKI is a CA and two certificates it signed, as PEM files: one for a
// server on 127.0.0.1 and localhost, one for a client.
type PKI struct {
	CAFile                string
	ServerCert, ServerKey string
	ClientCert, ClientKey string

	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64 // of the last certificate issued
}

// NewPKI writes a fresh CA, server and client certificates under
// tb.TempDir().
func NewPKI(tb testing.TB) *PKI {
	tb.Helper()
	p := &PKI{dir: tb.TempDir(), serial: 1}
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dedupe-stage test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	if p.caCert, err = x509.ParseCertificate(der); err != nil {
		tb.Fatal(err)
	}
	p.caKey = key
	p.CAFile = p.write(tb, "ca.pem", "CERTIFICATE", der)
	p.ServerCert, p.ServerKey = p.issue(tb, "server", x509.ExtKeyUsageServerAuth)
	p.ClientCert, p.ClientKey = p.issue(tb, "client", x509.ExtKeyUsageClientAuth)
	return p
}

// ServerTLS returns a RunServerWith edit that makes the server require TLS
// with a client certificate from the CA, and the TLS handshake before its
// first message when handshakeFirst is true.
func (p *PKI) ServerTLS(handshakeFirst bool) func(*server.Options) {
	return func(o *server.Options) {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: p.ServerCert, KeyFile: p.ServerKey, CaFile: p.CAFile, Verify: true,
		})
		if err != nil {
			panic("boottest: server TLS config: " + err.Error())
		}
		o.TLSConfig, o.TLS, o.TLSVerify, o.TLSTimeout = tc, true, true, 5
		o.TLSHandshakeFirst = handshakeFirst
	}
}

// issue writes a certificate signed by the CA for use and its key.
func (p *PKI) issue(tb testing.TB, name string, use x509.ExtKeyUsage) (certFile, keyFile string) {
	tb.Helper()
	key := newKey(tb)
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: "dedupe-stage test " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{use},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return p.write(tb, name+"-cert.pem", "CERTIFICATE", der), p.write(tb, name+"-key.pem", "EC PRIVATE KEY", kder)
}

func (p *PKI) write(tb testing.TB, name, typ string, der []byte) string {
	tb.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

// Operator is an operator with a system account and one application
// account that may use JetStream, and a user of that account.
type Operator struct {
	// CredsFile is the user's creds file (its JWT and NKey seed).
	CredsFile string
	// UserSeed is the user's NKey seed, which a redaction test may look for.
	UserSeed string

	claims   *jwt.OperatorClaims
	sys, app string // the accounts' public keys
	jwts     map[string]string
}

// NewOperator makes the operator, its accounts and the user, and writes
// the user's creds under tb.TempDir().
func NewOperator(tb testing.TB) *Operator {
	tb.Helper()
	opKP := mustKP(tb, nkeys.CreateOperator)
	opPub, _ := opKP.PublicKey()
	op := &Operator{claims: jwt.NewOperatorClaims(opPub), jwts: map[string]string{}}
	op.claims.Name = "test-operator"

	account := func(name string, js bool) (string, nkeys.KeyPair) {
		kp := mustKP(tb, nkeys.CreateAccount)
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		ac.Name = name
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		enc, err := ac.Encode(opKP)
		if err != nil {
			tb.Fatal(err)
		}
		op.jwts[pub] = enc
		return pub, kp
	}
	op.sys, _ = account("SYS", false)
	var appKP nkeys.KeyPair
	op.app, appKP = account("APP", true)

	userKP := mustKP(tb, nkeys.CreateUser)
	userPub, _ := userKP.PublicKey()
	uc := jwt.NewUserClaims(userPub)
	uc.Name = "stage"
	ujwt, err := uc.Encode(appKP)
	if err != nil {
		tb.Fatal(err)
	}
	seed, _ := userKP.Seed()
	op.UserSeed = string(seed)
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		tb.Fatal(err)
	}
	op.CredsFile = filepath.Join(tb.TempDir(), "stage.creds")
	if err := os.WriteFile(op.CredsFile, creds, 0o600); err != nil {
		tb.Fatal(err)
	}
	return op
}

// Configure is a RunServerWith edit that runs the server in operator mode
// trusting the operator, with its accounts in a memory resolver.
func (op *Operator) Configure(o *server.Options) {
	o.TrustedOperators = []*jwt.OperatorClaims{op.claims}
	o.SystemAccount = op.sys
	r := &server.MemAccResolver{}
	for pub, enc := range op.jwts {
		if err := r.Store(pub, enc); err != nil {
			panic("boottest: account resolver: " + err.Error())
		}
	}
	o.AccountResolver = r
}

func mustKP(tb testing.TB, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	tb.Helper()
	kp, err := create()
	if err != nil {
		tb.Fatal(err)
	}
	return kp
}
