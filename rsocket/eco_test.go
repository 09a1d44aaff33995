package rsocket

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"io"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"
)

// selfSigned returns a TLS certificate for "rsocket.test".
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rsocket.test"},
		DNSNames: []string{"rsocket.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestTLS runs TLS 1.3 over an rsocket connection and echoes 1 MiB
// through it.
func TestTLS(t *testing.T) {
	p := newPair(t, nil)
	cli, srv := p.connect(t, nil, nil)
	cert, pool := selfSigned(t)
	ts := tls.Server(srv, &tls.Config{Certificates: []tls.Certificate{cert}})
	tc := tls.Client(cli, &tls.Config{RootCAs: pool, ServerName: "rsocket.test"})
	defer ts.Close()
	defer tc.Close()
	go io.Copy(ts, ts) // echo
	data := pattern(9, 1<<20)
	go tc.Write(data)
	tc.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, len(data))
	if _, err := io.ReadFull(tc, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("TLS echo differs")
	}
	if st := tc.ConnectionState(); st.Version != tls.VersionTLS13 || !st.HandshakeComplete {
		t.Fatalf("TLS state %+v", st)
	}
}

// TestHTTP serves net/http over an rsocket listener and fetches from it
// with a client dialing rsocket, several requests on kept-alive
// connections, bodies checked by their SHA-256.
func TestHTTP(t *testing.T) {
	p := newPair(t, nil)
	ln, err := Listen(p.srv, ":0", nil)
	if err != nil {
		t.Fatal(err)
	}
	body := pattern(10, 300_000)
	mux := http.NewServeMux()
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) { w.Write(body) })
	mux.HandleFunc("/sum", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		io.Copy(h, r.Body)
		io.WriteString(w, hex.EncodeToString(h.Sum(nil)))
	})
	hs := &http.Server{Handler: mux}
	go hs.Serve(ln)
	defer hs.Close()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return DialContext(ctx, p.cli, addr, nil)
		}}}
	defer client.CloseIdleConnections()
	url := "http://" + ln.Addr().String()
	for i := range 3 {
		resp, err := client.Get(url + "/blob")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("GET %d: %d bytes, %v", i, len(got), err)
		}
		up := pattern(uint64(20+i), 100_000+i)
		resp, err = client.Post(url+"/sum", "application/octet-stream", bytes.NewReader(up))
		if err != nil {
			t.Fatal(err)
		}
		sum, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := sha256.Sum256(up)
		if string(sum) != hex.EncodeToString(want[:]) {
			t.Fatalf("POST %d: server saw sha256 %s, want %x", i, sum, want)
		}
	}
}
