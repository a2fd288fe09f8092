package main

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// IDX is one file of the IDX format used by MNIST: a big-endian header
// (two zero bytes, a type byte, the number of dimensions, then each
// dimension as a uint32) followed by the row-major payload. Only unsigned
// bytes (type 0x08) are used by MNIST, and only they are supported here.
type IDX struct {
	Dims []int
	Data []byte
}

const (
	idxUbyte   = 0x08
	idxMaxSize = 1 << 31 // refuse absurd headers before allocating
)

// ReadIDX reads an IDX file, gzip-compressed or raw (told apart by the
// gzip magic 1f 8b), and checks its header and length.
func ReadIDX(r io.Reader) (*IDX, error) {
	br := bufio.NewReader(r)
	if head, err := br.Peek(2); err == nil && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("idx: gzip: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReader(zr)
	}
	var magic [4]byte
	if _, err := io.ReadFull(br, magic[:]); err != nil {
		return nil, fmt.Errorf("idx: truncated header (magic): %w", err)
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, fmt.Errorf("idx: bad magic %#08x: not an IDX file (want 0x000008NN)", binary.BigEndian.Uint32(magic[:]))
	}
	if magic[2] != idxUbyte {
		return nil, fmt.Errorf("idx: element type %#02x not supported (only unsigned byte, 0x08)", magic[2])
	}
	nd := int(magic[3])
	if nd == 0 {
		return nil, errors.New("idx: header has zero dimensions")
	}
	dims := make([]int, nd)
	size := 1
	for i := range dims {
		var d [4]byte
		if _, err := io.ReadFull(br, d[:]); err != nil {
			return nil, fmt.Errorf("idx: truncated header (dimension %d of %d): %w", i+1, nd, err)
		}
		dims[i] = int(binary.BigEndian.Uint32(d[:]))
		size *= dims[i]
		if size > idxMaxSize {
			return nil, fmt.Errorf("idx: dimensions %v exceed %d bytes", dims[:i+1], idxMaxSize)
		}
	}
	data := make([]byte, size)
	if n, err := io.ReadFull(br, data); err != nil {
		return nil, fmt.Errorf("idx: truncated: header %v promises %d bytes of data, file has %d: %w", dims, size, n, err)
	}
	if n, _ := io.Copy(io.Discard, br); n > 0 {
		return nil, fmt.Errorf("idx: %d bytes of trailing data after the %d promised by header %v", n, size, dims)
	}
	return &IDX{Dims: dims, Data: data}, nil
}

// readIDXFile opens name in fsys, or name+".gz" if name is missing.
func readIDXFile(fsys fs.FS, name string) (*IDX, error) {
	f, err := fsys.Open(name + ".gz")
	if errors.Is(err, fs.ErrNotExist) {
		f, err = fsys.Open(name)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	x, err := ReadIDX(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return x, nil
}
