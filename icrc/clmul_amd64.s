//go:build amd64 && !purego

#include "textflag.h"

// Carry-less-multiply folding of CRC-32 (IEEE, reflected), the method of
// Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ".
// hash/crc32 has it for 128-bit registers and for AVX-512; this is the
// 256-bit (VEX) form, twice the bytes per multiply on CPUs that have
// VPCLMULQDQ but not AVX-512 (AMD Zen 3, Intel Alder Lake and later cores).
//
// Fold constants for a distance of D bits: x^(D+32) and x^(D-32) mod P,
// bit-reflected and shifted left once (foldConstant in clmul_test.go
// derives them); then x^64's, and the Barrett pair (P and floor(x^64/P),
// reflected).
DATA fold512<>+0(SB)/8, $0x154442bd4
DATA fold512<>+8(SB)/8, $0x1c6e41596
GLOBL fold512<>(SB), RODATA, $16

DATA fold128<>+0(SB)/8, $0x1751997d0
DATA fold128<>+8(SB)/8, $0x0ccaa009e
GLOBL fold128<>(SB), RODATA, $16

DATA fold64<>+0(SB)/8, $0x163cd6124
GLOBL fold64<>(SB), RODATA, $8

DATA barrett<>+0(SB)/8, $0x1db710641
DATA barrett<>+8(SB)/8, $0x1f7011641
GLOBL barrett<>(SB), RODATA, $16

// func foldWide(s uint32, p []byte) uint32
//
// foldWide returns the CRC register after p given s, the register before
// it (not inverted). len(p) must be at least 64 and a multiple of 16. Two
// YMM accumulators hold 64 bytes; each 128-bit lane folds 512 bits forward
// per step, then the four lanes fold into one, the rest of p 16 bytes at a
// time, and the 128-bit remainder reduces to 32 bits.
TEXT ·foldWide(SB), NOSPLIT, $0-36
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVL s+0(FP), AX
	VMOVD AX, X0
	VMOVDQU (SI), Y1
	VMOVDQU 32(SI), Y2
	VPXOR Y0, Y1, Y1
	ADDQ $64, SI
	SUBQ $64, CX
	CMPQ CX, $64
	JB   narrow

	VBROADCASTI128 fold512<>(SB), Y0

wideLoop:
	VPCLMULQDQ $0x00, Y0, Y1, Y3
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VPCLMULQDQ $0x00, Y0, Y2, Y4
	VPCLMULQDQ $0x11, Y0, Y2, Y2
	VPXOR (SI), Y3, Y3
	VPXOR 32(SI), Y4, Y4
	VPXOR Y3, Y1, Y1
	VPXOR Y4, Y2, Y2
	ADDQ $64, SI
	SUBQ $64, CX
	CMPQ CX, $64
	JAE  wideLoop

narrow:
	// The four 128-bit lanes, in message order: X1, X5, X2, X6.
	VEXTRACTI128 $1, Y1, X5
	VEXTRACTI128 $1, Y2, X6
	VMOVDQU fold128<>(SB), X0

	// Fold each lane onto the next: 128 bits forward.
	VPCLMULQDQ $0x00, X0, X1, X3
	VPCLMULQDQ $0x11, X0, X1, X1
	VPXOR X3, X1, X1
	VPXOR X5, X1, X1

	VPCLMULQDQ $0x00, X0, X1, X3
	VPCLMULQDQ $0x11, X0, X1, X1
	VPXOR X3, X1, X1
	VPXOR X2, X1, X1

	VPCLMULQDQ $0x00, X0, X1, X3
	VPCLMULQDQ $0x11, X0, X1, X1
	VPXOR X3, X1, X1
	VPXOR X6, X1, X1

	CMPQ CX, $16
	JB   reduce

tail16:
	VPCLMULQDQ $0x00, X0, X1, X3
	VPCLMULQDQ $0x11, X0, X1, X1
	VPXOR X3, X1, X1
	VPXOR (SI), X1, X1
	ADDQ $16, SI
	SUBQ $16, CX
	CMPQ CX, $16
	JAE  tail16

reduce:
	// 128 bits to 64: the low qword times x^(64+32)'s constant onto the high.
	VPCLMULQDQ $0x01, X1, X0, X3
	VPSRLDQ $8, X1, X1
	VPXOR X3, X1, X1

	// 64 bits to 32 (low dword times its constant, onto the rest).
	VPCMPEQB X4, X4, X4
	VPSRLQ $32, X4, X4
	VPSRLDQ $4, X1, X2
	VPAND X4, X1, X1
	VMOVQ fold64<>(SB), X0
	VPCLMULQDQ $0x00, X0, X1, X1
	VPXOR X2, X1, X1

	// Barrett reduction to the 32-bit remainder.
	VMOVDQU barrett<>(SB), X0
	VPAND X4, X1, X2
	VPCLMULQDQ $0x10, X0, X2, X2
	VPAND X4, X2, X2
	VPCLMULQDQ $0x00, X0, X2, X2
	VPXOR X2, X1, X1
	VPEXTRD $1, X1, AX
	VZEROUPPER
	MOVL AX, ret+32(FP)
	RET

// func cpuid7ECX() uint32
//
// CPUID leaf 7, subleaf 0: ECX bit 10 is VPCLMULQDQ, which
// golang.org/x/sys/cpu reports only together with AVX-512.
TEXT ·cpuid7ECX(SB), NOSPLIT, $0-4
	MOVL $7, AX
	MOVL $0, CX
	CPUID
	MOVL CX, ret+0(FP)
	RET
