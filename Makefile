# vkgdr's C library (libvkgdr.so.1, libvkgdr.a, vkgdr.h, vkgdr.pc), built and installed the way
# vkgdr 0.1's documentation tells its users to:
#
#   make                                         the library, optimised (cargo's `dist` profile: fat LTO)
#   make install                                 under /usr/local: lib/, include/, lib/pkgconfig/
#   make install PREFIX=$HOME/.local             elsewhere
#   make install PREFIX=/usr DESTDIR=/tmp/stage  staged for a package: files under
#                                                /tmp/stage/usr, vkgdr.pc says prefix=/usr
#
# scripts/install-c does the installing (this file only hands it its knobs), so `make install`
# and `scripts/install-c` install exactly the same files. Knobs: PREFIX, DESTDIR, CUDA_INCLUDE
# (where <cuda.h> is, for vkgdr.pc), VKGDR_LIB_DIR (install libvkgdr_capi.so/.a already built
# there instead of building), CARGO (the cargo to run).

PREFIX ?= /usr/local
DESTDIR ?=
CUDA_INCLUDE ?=
VKGDR_LIB_DIR ?=
CARGO ?= cargo

ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))

.PHONY: all install clean

all:
	$(CARGO) build --manifest-path '$(ROOT)/Cargo.toml' --profile dist -p vkgdr-capi

install:
	PREFIX='$(PREFIX)' DESTDIR='$(DESTDIR)' CUDA_INCLUDE='$(CUDA_INCLUDE)' \
	    VKGDR_LIB_DIR='$(VKGDR_LIB_DIR)' CARGO='$(CARGO)' '$(ROOT)/scripts/install-c'

clean:
	$(CARGO) clean --manifest-path '$(ROOT)/Cargo.toml' --profile dist -p vkgdr-capi
