/* SPDX-License-Identifier: MIT */
/* mosaickv — umbrella header: include this one. */
#ifndef MOSAICKV_H
#define MOSAICKV_H

#include <mosaickv/common.h>
#include <mosaickv/compress.h>
#include <mosaickv/attention.h>
#include <mosaickv/store.h>
#include <mosaickv/sequence.h>

#endif
