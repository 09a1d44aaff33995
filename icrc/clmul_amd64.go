//go:build amd64 && !purego

package icrc

import "golang.org/x/sys/cpu"

// foldWide is in clmul_amd64.s.
//
//go:noescape
func foldWide(s uint32, p []byte) uint32

// cpuid7ECX is in clmul_amd64.s.
func cpuid7ECX() uint32

// hasWide reports whether foldWide can run: 256-bit VPCLMULQDQ (CPUID
// leaf 7 ECX bit 10) with AVX2 and the OS saving YMM registers.
var hasWide = cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ && cpuid7ECX()&(1<<10) != 0
