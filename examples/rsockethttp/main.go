// Command rsockethttp serves HTTP, or HTTPS, over rsocket and fetches from
// it: the standard library's net/http and crypto/tls on an rxego device,
// with nothing RDMA-specific but the listener and the dialer. The server
// answers GET /hello with a greeting and POST /sha256 with the digest of
// the body. A C program under LD_PRELOAD=librspreload.so (curl) reaches
// the plain-HTTP server as well.
//
//	go run ./examples/rsockethttp -serve 127.0.0.1:8080          # server
//	go run ./examples/rsockethttp -get 127.0.0.1:8080 -from 127.0.0.2
//	go run ./examples/rsockethttp -demo                          # both, on loopback, with TLS
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/rsocket"
)

func main() {
	serve := flag.String("serve", "", "serve HTTP over rsocket on ADDR:PORT (ADDR is the RoCE device's address)")
	get := flag.String("get", "", "GET /hello and POST /sha256 from the server at ADDR:PORT")
	from := flag.String("from", "", "with -get: the client's RoCE address")
	demo := flag.Bool("demo", false, "run an HTTPS server and client on 127.0.0.1 and 127.0.0.2")
	flag.Parse()
	var err error
	switch {
	case *demo:
		err = runDemo(os.Stdout)
	case *serve != "":
		err = runServer(*serve)
	case *get != "" && *from != "":
		err = runClient(os.Stdout, *get, *from)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// manager opens a device on addr (rxego's UDP port) with a connection
// manager; close frees both.
func manager(addr string) (m *cm.Manager, close func(), err error) {
	dev, err := rxego.Open(addr, nil)
	if err != nil {
		return nil, nil, err
	}
	if m, err = cm.New(dev, nil); err != nil {
		dev.Close()
		return nil, nil, err
	}
	return m, func() { m.Close(); dev.Close() }, nil
}

// handler is the example's HTTP service.
func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over rsocket, %s\n", r.RemoteAddr)
	})
	mux.HandleFunc("POST /sha256", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d bytes, sha256 %x\n", n, h.Sum(nil))
	})
	return mux
}

func runServer(addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return err
	}
	m, closeDev, err := manager(ap.Addr().String())
	if err != nil {
		return err
	}
	defer closeDev()
	ln, err := rsocket.Listen(m, addr, nil)
	if err != nil {
		return err
	}
	log.Printf("serving HTTP over rsocket on %v", ln.Addr())
	return http.Serve(ln, handler())
}

// client returns an HTTP client whose connections are rsockets from m.
func client(m *cm.Manager, tlsConf *tls.Config) *http.Client {
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: tlsConf,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return rsocket.DialContext(ctx, m, addr, nil)
		},
	}}
}

// fetch does the example's two requests and prints the answers.
func fetch(w io.Writer, c *http.Client, base string) error {
	resp, err := c.Get(base + "/hello")
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "GET /hello: %s %s", resp.Status, body)
	payload := strings.Repeat("rsocket ", 1<<17) // 1 MiB
	resp, err = c.Post(base+"/sha256", "application/octet-stream", strings.NewReader(payload))
	if err != nil {
		return err
	}
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	want := sha256.Sum256([]byte(payload))
	if !strings.Contains(string(body), hex.EncodeToString(want[:])) {
		return fmt.Errorf("the server's digest %q is not %x", body, want)
	}
	fmt.Fprintf(w, "POST /sha256: %s %s", resp.Status, body)
	return nil
}

func runClient(w io.Writer, addr, from string) error {
	m, closeDev, err := manager(from)
	if err != nil {
		return err
	}
	defer closeDev()
	c := client(m, nil)
	defer c.CloseIdleConnections()
	return fetch(w, c, "http://"+addr)
}

// runDemo serves HTTPS on 127.0.0.1 and fetches from it on 127.0.0.2.
func runDemo(w io.Writer) error {
	return demoOn(w, "127.0.0.1", "127.0.0.2")
}

func demoOn(w io.Writer, srvAddr, cliAddr string) error {
	sm, closeSrv, err := manager(srvAddr)
	if err != nil {
		return err
	}
	defer closeSrv()
	cm, closeCli, err := manager(cliAddr)
	if err != nil {
		return err
	}
	defer closeCli()
	cert, pool, err := selfSigned()
	if err != nil {
		return err
	}
	ln, err := rsocket.Listen(sm, srvAddr+":0", nil)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: handler(), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go hs.ServeTLS(ln, "", "")
	defer hs.Close()
	c := client(cm, &tls.Config{RootCAs: pool, ServerName: "rsocket.example"})
	defer c.CloseIdleConnections()
	return fetch(w, c, "https://"+ln.Addr().String())
}

// selfSigned makes a certificate for rsocket.example and a pool trusting
// it.
func selfSigned() (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rsocket.example"},
		DNSNames: []string{"rsocket.example"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool, nil
}
