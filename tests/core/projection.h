/* SPDX-License-Identifier: MIT */
/* The encoder's projection, computed independently of the library. */
#ifndef MKV_TEST_PROJECTION_H
#define MKV_TEST_PROJECTION_H

#include <stdint.h>

/*
 * P = (R Rᵀ)⁻¹ R for a stored rotation R (dk × d, row-major, double): the
 * matrix the encoder projects rows with (X' = X Pᵀ), so that X' R is X's
 * projection onto R's rows.  Where R Rᵀ is not within 2^-4 of I (a
 * rotation given far from orthonormal), or equals I, P = R, as the
 * library does.  Gauss-Jordan with partial pivoting in double: a
 * different algorithm from the library's Cholesky.
 */
void th_projection(const double *R, uint32_t dk, uint32_t d, double *P);

#endif
