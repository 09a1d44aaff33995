package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/rxego/rxego/conformance/agentproto"
)

// readLimited reads at most agentproto.MaxFile bytes of path; sysfs files
// report size 0, so the size is not trusted.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, agentproto.MaxFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > agentproto.MaxFile {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, agentproto.MaxFile)
	}
	return data, nil
}

func readFile(path string) *agentproto.Response {
	if path == "" {
		return errResp(errors.New("read: empty path"))
	}
	data, err := readLimited(path)
	if err != nil {
		return errResp(err)
	}
	return &agentproto.Response{Data: data}
}

// globFiles returns the regular files matching pattern; unreadable ones
// (some sysfs counters refuse reads) are skipped rather than failing all.
func globFiles(pattern string) *agentproto.Response {
	if pattern == "" {
		return errResp(errors.New("glob: empty pattern"))
	}
	names, err := filepath.Glob(pattern)
	if err != nil {
		return errResp(err)
	}
	files := make(map[string][]byte, len(names))
	for _, n := range names {
		st, err := os.Stat(n)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		data, err := readLimited(n)
		if err != nil {
			continue
		}
		files[n] = data
	}
	return &agentproto.Response{Files: files}
}

func writeFile(path string, data []byte, mode uint32) *agentproto.Response {
	if path == "" {
		return errResp(errors.New("write: empty path"))
	}
	perm := fs.FileMode(mode) & fs.ModePerm
	if perm == 0 {
		perm = 0o644
	}
	if err := os.WriteFile(path, data, perm); err != nil {
		return errResp(err)
	}
	// WriteFile keeps the mode of an existing file; the caller asked for perm.
	if err := os.Chmod(path, perm); err != nil {
		return errResp(err)
	}
	return &agentproto.Response{}
}
