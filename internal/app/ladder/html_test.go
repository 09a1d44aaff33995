package ladder_test

import (
	"bytes"
	"context"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/app/ladder"
)

// pageCaptures are the captures the HTML tests render: loss, RNR and CNPs
// recorded by rxego, 16 QP pairs, READs, and UD plus RC traffic.
var pageCaptures = []string{
	"testdata/rxego_loss.pcapng", "testdata/rxego_rnr.pcapng", "testdata/rxego_cnp.pcapng",
	"../../../testdata/pcaps/srq_6.12.pcapng", "../../../testdata/pcaps/verbs_read_6.12.pcapng", "../../../testdata/pcaps/rping_6.12.pcapng",
}

// messages counts a trace's messages.
func messages(tr *ladder.Trace) int {
	n := 0
	for _, c := range tr.Conversations {
		n += len(c.Messages)
	}
	return n
}

// page writes tr's page into a temporary file.
func page(t *testing.T, tr *ladder.Trace, name string) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	if err := ladder.WriteHTML(&b, tr, ladder.HTMLOptions{Title: name}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".html")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, b.Bytes()
}

// TestHTMLStructure checks, without a browser, that the page has one
// message group per message in the ladders and one bar per message on
// the timeline, and no external resources.
func TestHTMLStructure(t *testing.T) {
	for _, path := range pageCaptures {
		tr := analyse(t, path)
		_, b := page(t, tr, filepath.Base(path))
		s := string(b)
		n := messages(tr)
		if g, bars := strings.Count(s, `<g class="msg"`), strings.Count(s, `class="msgbar"`); g != n || bars != n || n == 0 {
			t.Errorf("%s: %d message groups and %d timeline bars for %d messages", path, g, bars, n)
		}
		if strings.Contains(s, "http://") && !strings.Contains(s, `xmlns="http://www.w3.org/2000/svg"`) || strings.Contains(s, "src=") {
			t.Errorf("%s: the page refers to something outside itself", path)
		}
	}
}

// renderCheck is what the page's script reports once it has rendered.
var renderCheck = regexp.MustCompile(`<pre id="render-check" hidden="">ladder-messages (\d+)/(\d+) timeline-messages (\d+)/(\d+) packets (\d+)/(\d+) fit (\d+)/(\d+)</pre>`)

// browserCaptures are the pages opened in a browser (a few seconds
// each): a loss and its recovery, congestion with a busy timeline, and
// sixteen QP pairs.
var browserCaptures = []string{"testdata/rxego_loss.pcapng", "testdata/rxego_cnp.pcapng", "../../../testdata/pcaps/srq_6.12.pcapng"}

// TestHTMLRendersInChromium opens pages in headless Chromium and reads
// back the DOM after load: the page's script found every message of the
// capture drawn with a visible size in the ladders and on the timeline,
// and every message's summary is in the page.
func TestHTMLRendersInChromium(t *testing.T) {
	browser := needChromium(t)
	for _, path := range browserCaptures {
		t.Run(filepath.Base(path), func(t *testing.T) {
			tr := analyse(t, path)
			file, _ := page(t, tr, filepath.Base(path))
			dom := dumpDOM(t, browser, file)
			m := renderCheck.FindStringSubmatch(dom)
			if m == nil {
				t.Fatalf("no render check in the DOM (did the script run?):\n%.2000s", dom)
			}
			n := strconv.Itoa(messages(tr))
			if m[1] != n || m[2] != n || m[3] != n || m[4] != n || m[5] != m[6] || m[5] == "0" {
				t.Errorf("rendered %s; the capture has %s messages", m[0], n)
			}
			// In a 1400-pixel window every drawing fits: nothing, the
			// timeline's axis and last packet included, is off to the right.
			if m[7] != m[8] || m[8] == "0" {
				t.Errorf("rendered %s: a drawing wider than the window", m[0])
			}
			for _, c := range tr.Conversations {
				for _, msg := range c.Messages {
					if !strings.Contains(dom, html.EscapeString(msg.Summary())) {
						t.Errorf("message %q not in the page", msg.Summary())
					}
				}
			}
		})
	}
}

// dumpDOM loads a page in headless Chromium and returns the DOM after its
// load handlers ran.
func dumpDOM(t *testing.T, browser, file string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--window-size=1400,1000", "--dump-dom", "file://"+file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.String())
	}
	return string(out)
}

// needChromium returns the Chromium binary, or skips the test when there
// is none (outside CI, where it must be installed).
func needChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("Chromium is not installed; CI must install it (apt-get install -y chromium)")
	}
	t.Skip("Chromium not installed: apt-get install -y chromium")
	return ""
}

// TestHTMLCM checks that the page of an rping capture names the CM
// messages on their arrows and gives their fields in the tooltips.
func TestHTMLCM(t *testing.T) {
	tr := analyse(t, "../../../testdata/pcaps/rping_6.12.pcapng")
	_, b := page(t, tr, "rping")
	s := string(b)
	for _, want := range []string{"CM REQ #1 id 0x088c41c6 qpn 0x000011 psn 7729957", "CM REP #2 id 0xcf512179 qpn 0x000011 psn 1236684",
		"CM RTU #3", "CM DREQ #4", "CM DREP #5", "service_id=0x0000000001061c06", "remote_id=0x088c41c6"} {
		if !strings.Contains(s, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
