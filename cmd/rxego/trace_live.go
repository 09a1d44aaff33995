package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxego/rxego/cmd/rxego/internal/livecap"
	"github.com/rxego/rxego/cmd/rxego/internal/progress"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/capfile"
)

// livePoll is how long a live capture waits for a frame before it checks
// whether to stop.
const livePoll = 100 * time.Millisecond

// traceLive captures on f.iface until --count packets, --duration or an
// interrupt, handing each RoCEv2 record to each as it arrives and writing
// the frames to -w.
func traceLive(w *bufio.Writer, f *traceFlags, each func(trace.Record) error) error {
	var host netip.Addr
	if f.host != "" {
		var err error
		if host, err = netip.ParseAddr(f.host); err != nil {
			return fmt.Errorf("--host: %v", err)
		}
	}
	if f.bufferKiB < 1 || f.bufferKiB > 1<<20 {
		return fmt.Errorf("-B %d: want a buffer of 1 to 1048576 KiB (1 GiB)", f.bufferKiB)
	}
	c, err := livecap.Open(f.iface, livePoll, livecap.Options{Host: host, Buffer: f.bufferKiB << 10})
	if err != nil {
		return err
	}
	defer c.Close()
	filter := "udp port 4791"
	if host.IsValid() {
		filter += " and host " + host.String()
	}
	start := time.Now()
	var ng *pcapgo.NgWriter
	if f.write != "" {
		fh, err := os.Create(f.write)
		if err != nil {
			return err
		}
		defer fh.Close()
		intf := pcapgo.NgInterface{Name: f.iface, LinkType: c.LinkType(), Filter: filter, OS: "linux"}
		if ng, err = pcapgo.NewNgWriterInterface(fh, intf, pcapgo.NgWriterOptions{SectionInfo: pcapgo.NgSectionInfo{Application: "rxego trace"}}); err != nil {
			return err
		}
		defer ng.Flush()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if f.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.duration)
		defer cancel()
	}
	var n atomic.Int64
	rep := progress.Start(os.Stderr, progress.Wanted(os.Stderr, f.progress), func() string {
		return fmt.Sprintf("rxego trace: capturing on %s: %d RoCE packets", f.iface, n.Load())
	})
	defer rep.Stop()
	fmt.Fprintf(os.Stderr, "rxego trace: capturing on %s (%s)\n", f.iface, filter)
	defer func() { reportDrops(c, ng, start, n.Load()) }()
	link := c.LinkType()
	said := false
	for frame := 1; ctx.Err() == nil && (f.count == 0 || int(n.Load()) < f.count); {
		fr, err := c.Next()
		if errors.Is(err, livecap.ErrTimeout) {
			continue
		}
		if err != nil {
			return err
		}
		frames, gso := gsoSegments(c, link, fr)
		if gso != nil && !said {
			how := "the segment size from the kernel"
			if gso.Inferred {
				how = "the segment size inferred from the RoCE headers (the kernel does not say before 6.2)"
			}
			fmt.Fprintf(os.Stderr, "rxego trace: cutting GSO datagrams into the segments the peer receives, %s; those packets are marked gso(seg=I/N ...)\n", how)
			said = true
		}
		for i, data := range frames {
			if f.count != 0 && int(n.Load()) >= f.count {
				break
			}
			rec, ok := trace.FromFrame(frame, fr.Time, link, data)
			if !ok || host.IsValid() && rec.Src != host && rec.Dst != host {
				break // the segments share their addresses
			}
			if gso != nil {
				g := *gso
				g.Index = i + 1
				rec.GSO = &g
			}
			if ng != nil {
				ci := gopacket.CaptureInfo{Timestamp: fr.Time, CaptureLength: len(data), Length: len(data)}
				if err := ng.WritePacket(ci, data); err != nil {
					return err
				}
			}
			frame++
			n.Add(1)
			if err := each(rec); err != nil {
				return err
			}
		}
		if f.printsPackets() {
			w.Flush() // live lines appear as packets arrive
		}
	}
	return nil
}

// reportDrops says on stderr, as tcpdump does, how many RoCE packets the
// capture kept and how many frames the kernel dropped because the socket's
// buffer was full (those the trace misses), and records both in the
// pcapng file's interface statistics.
func reportDrops(c *livecap.Capture, ng *pcapgo.NgWriter, start time.Time, kept int64) {
	st, err := c.Stats()
	if err != nil {
		fmt.Fprintf(os.Stderr, "rxego trace: %v\n", err)
		return
	}
	fmt.Fprintf(os.Stderr, "rxego trace: %d RoCE packets kept, %d frames dropped by the kernel\n", kept, st.Dropped)
	if st.Dropped > 0 {
		fmt.Fprintln(os.Stderr, "rxego trace: the trace misses the dropped frames (the capture fell behind); a larger -B, or --host, keeps up")
	}
	if ng != nil {
		now := time.Now()
		ng.WriteInterfaceStats(0, pcapgo.NgInterfaceStatistics{LastUpdate: now, StartTime: start, EndTime: now,
			PacketsReceived: st.Frames - st.Dropped, PacketsDropped: st.Dropped})
	}
}

// gsoSegments returns the frames of the packets in fr: fr itself, or, for
// a UDP GSO datagram the kernel has not cut yet, its segments as the peer
// receives them, with where they came from (Index left to the caller).
func gsoSegments(c *livecap.Capture, link layers.LinkType, fr livecap.Frame) ([][]byte, *trace.GSOSegment) {
	size, inferred := fr.GSOSize, false
	if size == 0 && !c.KnowsGSO() {
		size, inferred = capfile.InferGSOSize(link, fr.Data), true
	}
	if size > 0 {
		if segs := capfile.SplitGSO(link, fr.Data, size); segs != nil {
			return segs, &trace.GSOSegment{Count: len(segs), Size: size, Inferred: inferred}
		}
	}
	return [][]byte{fr.Data}, nil
}
