/* placeholder: not implemented yet */
